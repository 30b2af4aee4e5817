/*
 * test_npy.c - the .npy reader of the iha tool (tools/common/npy.c): valid files of every
 * header version and dtype, and malformed ones that must fail with a message naming the
 * problem, from memory (npy_parse) and from a file (npy_read) alike, never crashing; and paths
 * that are not regular files (FIFOs, devices, directories), refused. The writer is
 * test_npy_write.c's.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, mkfifo, mknod, symlink, S_IFCHR */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/npy.h"
#include "test_files.h"

/* A .npy image: magic, version major.0, the header text padded to a 16-byte boundary and
 * ended by '\n' (as NumPy writes), then `data_len` bytes of data. Caller frees. */
static unsigned char *make_npy_text(int major, const char *dict, size_t dict_len, const void *data, size_t data_len,
                                    size_t *size)
{
    size_t prefix = major == 1 ? 10 : 12, text = dict_len + 1;
    size_t header_len = (prefix + text + 15) / 16 * 16 - prefix;
    unsigned char *b = malloc(prefix + header_len + data_len + 1);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    b[8] = (unsigned char)(header_len & 0xff);
    b[9] = (unsigned char)(header_len >> 8);
    if (major > 1)
        b[10] = b[11] = 0;
    memcpy(b + prefix, dict, text - 1);
    memset(b + prefix + text - 1, ' ', header_len - text);
    b[prefix + header_len - 1] = '\n';
    if (data_len)
        memcpy(b + prefix + header_len, data, data_len);
    *size = prefix + header_len + data_len;
    return b;
}

static unsigned char *make_npy(int major, const char *dict, const void *data, size_t data_len, size_t *size)
{
    return make_npy_text(major, dict, strlen(dict), data, data_len, size);
}

/* A message must not carry a header's control bytes to the terminal. */
static void expect_printable(const char *err)
{
    for (const unsigned char *p = (const unsigned char *)err; *p; p++)
        if (*p < 0x20 || *p >= 0x7f)
            fail_msg("message '%s' holds the raw byte 0x%02x", err, *p);
}

static char *write_temp(const char *name, const unsigned char *bytes, size_t size)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tf_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Parses from memory and from a file; both must succeed with the same header and data. */
static void expect_success(const unsigned char *bytes, size_t size, npy_array *out)
{
    char err[256] = "";
    npy_array from_file;
    int rc = npy_parse(bytes, size, out, err, sizeof err);
    if (rc != 0)
        fail_msg("npy_parse failed: %s", err);
    char *path = write_temp("ok.npy", bytes, size);
    rc = npy_read(path, &from_file, err, sizeof err);
    if (rc != 0)
        fail_msg("npy_read failed: %s", err);
    assert_int_equal(from_file.header.count, out->header.count);
    assert_int_equal(from_file.header.ndim, out->header.ndim);
    if (out->header.count)
        assert_memory_equal(from_file.data, out->data, out->header.count * sizeof(float));
    npy_free(&from_file);
    unlink(path);
}

/* Both readers must fail, leave the array empty and say something containing `needle`. */
static void expect_failure(const unsigned char *bytes, size_t size, const char *needle)
{
    char err[256] = "";
    npy_array a;
    assert_int_equal(npy_parse(bytes, size, &a, err, sizeof err), -1);
    assert_null(a.data);
    if (!strstr(err, needle))
        fail_msg("npy_parse message '%s' does not mention '%s'", err, needle);
    expect_printable(err);
    char *path = write_temp("bad.npy", bytes, size);
    err[0] = '\0';
    assert_int_equal(npy_read(path, &a, err, sizeof err), -1);
    assert_null(a.data);
    if (!strstr(err, needle))
        fail_msg("npy_read message '%s' does not mention '%s'", err, needle);
    expect_printable(err);
    unlink(path);
}

static void expect_dict_failure(const char *dict, size_t data_len, const char *needle)
{
    size_t size;
    unsigned char zeros[64] = {0};
    assert_true(data_len <= sizeof zeros);
    unsigned char *b = make_npy(1, dict, zeros, data_len, &size);
    expect_failure(b, size, needle);
    free(b);
}

/* ---- Valid files ------------------------------------------------------------------------ */

static void valid_f4_version1(void **state)
{
    (void)state;
    const float values[6] = {1.5f, -2.0f, 3.25f, 4.0f, -5.5f, 6.0f};
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", values,
                                sizeof values, &size);
    npy_array a;
    expect_success(b, size, &a);
    assert_int_equal(a.header.version_major, 1);
    assert_int_equal(a.header.dtype, NPY_F32);
    assert_int_equal(a.header.ndim, 2);
    assert_int_equal(a.header.shape[0], 2);
    assert_int_equal(a.header.shape[1], 3);
    assert_memory_equal(a.data, values, sizeof values);
    npy_free(&a);
    free(b);
}

static void valid_f8_version2(void **state)
{
    (void)state;
    const double values[4] = {0.1, -1e-30, 12345.678, -3.0};
    size_t size;
    unsigned char *b = make_npy(2, "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }", values,
                                sizeof values, &size);
    npy_array a;
    expect_success(b, size, &a);
    assert_int_equal(a.header.version_major, 2);
    assert_int_equal(a.header.dtype, NPY_F64);
    assert_int_equal(a.header.ndim, 1);
    for (int i = 0; i < 4; i++)
        assert_true(a.data[i] == (float)values[i]);
    npy_free(&a);
    free(b);
}

/* Version 3.0 differs only in the header's text encoding; key order and quotes may vary. */
static void valid_version3_any_key_order(void **state)
{
    (void)state;
    const float values[2] = {7.0f, 8.0f};
    size_t size;
    unsigned char *b = make_npy(3, "{\"shape\": (1, 2, 1), \"fortran_order\": False, \"descr\": \"<f4\"}", values,
                                sizeof values, &size);
    npy_array a;
    expect_success(b, size, &a);
    assert_int_equal(a.header.ndim, 3);
    assert_int_equal(a.header.count, 2);
    npy_free(&a);
    free(b);
}

static void valid_scalar_and_empty(void **state)
{
    (void)state;
    const float one = 42.0f;
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", &one, 4, &size);
    npy_array a;
    expect_success(b, size, &a);
    assert_int_equal(a.header.ndim, 0);
    assert_int_equal(a.header.count, 1);
    assert_true(a.data[0] == 42.0f);
    npy_free(&a);
    free(b);
    b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0, &size);
    expect_success(b, size, &a);
    assert_int_equal(a.header.count, 0);
    npy_free(&a);
    free(b);
}

/* ---- Malformed files -------------------------------------------------------------------- */

static void bad_magic(void **state)
{
    (void)state;
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "abcd", 4, &size);
    b[1] = 'X';
    expect_failure(b, size, "magic");
    expect_failure((const unsigned char *)"", 0, "empty");
    free(b);
}

static void unsupported_version(void **state)
{
    (void)state;
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "abcd", 4, &size);
    b[6] = 4;
    expect_failure(b, size, "version 4.0");
    free(b);
}

static void truncated_header(void **state)
{
    (void)state;
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "abcd", 4, &size);
    expect_failure(b, 7, "truncated");
    expect_failure(b, 9, "truncated");
    expect_failure(b, 30, "truncated"); /* inside the dictionary */
    free(b);
}

static void header_length_beyond_file(void **state)
{
    (void)state;
    size_t size;
    unsigned char *b = make_npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "abcd", 4, &size);
    b[9] = 0x10; /* 4096 + the real length: past the end */
    expect_failure(b, size, "beyond the end");
    b[11] = 0x7f; /* ~2 GiB: over the reader's limit */
    expect_failure(b, size, "larger than");
    free(b);
}

/* Headers whose dictionary is refused, a CMocka case per row: each failure is a dictionary,
 * the data bytes after it and what the message must say. */
typedef struct dict_case {
    const char *name;
    struct dict_failure {
        const char *dict;
        size_t data_len;
        const char *needle;
    } failures[6];
} dict_case;

static const dict_case kDictCases[] = {
    {"missing_keys",
     {
         {"{'descr': '<f4', 'fortran_order': False, }", 0, "missing key 'shape'"},
         {"{'fortran_order': False, 'shape': (1,), }", 4, "missing key 'descr'"},
         {"{'descr': '<f4', 'shape': (1,), }", 4, "missing key 'fortran_order'"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4, "'extra'"},
         {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, "repeated"},
         {"'descr': '<f4'", 4, "dictionary"},
     }},
    {"bad_descr",
     {
         {"{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", 4, "'<i4' is not supported"},
         {"{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4, "big-endian"},
         {"{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", 8, "big-endian"},
         {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4, "'descr' must be a quoted string"},
         {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", 4, "not supported"},
     }},
    {"fortran_order_true",
     {
         {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "fortran_order is True"},
         {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4, "fortran_order"},
     }},
    {"bad_shape_text",
     {
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 8, "shape"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", 24, "shape"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", 16, "trailing comma"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", 24, "tuple"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24, "non-negative"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 24, "shape"},
     }},
    {"shape_overflow",
     {
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", 0,
          "overflow"},
         /* Product fits in size_t, times 8 bytes does not. */
         {"{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", 0, "overflow"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (123456789012345678901234567890,), }", 0,
          "too large"},
         /* A huge but representable shape: refused by length, before anything is allocated. */
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 4, "truncated"},
     }},
    {"data_length_mismatch",
     {
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, "truncated"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28, "trailing"},
         {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 12, "needs 24 bytes"},
     }},
    /* Messages quote header text with every byte outside printable ASCII as \xNN, so a forged
     * header cannot send escape sequences to the terminal and the message says what the file holds. */
    {"control_bytes_escaped",
     {
         {"{'descr': '<i\x1b[2J', 'fortran_order': False, 'shape': (1,), }", 4, "'<i\\x1b[2J'"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'a\x07': 1}", 4, "key 'a\\x07'"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (\x9b" "2,), }", 4, "'\\x9b2,)"},
         {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\x1b]0;x\x07", 4, "'\\x1b]0;x\\x07"},
     }},
};

/* A kDictCases row, *state: every failure it lists. */
static void dict_case_refused(void **state)
{
    const dict_case *c = *state;
    for (size_t i = 0; i < sizeof c->failures / sizeof c->failures[0] && c->failures[i].dict; ++i)
        expect_dict_failure(c->failures[i].dict, c->failures[i].data_len, c->failures[i].needle);
}

static void float64_out_of_float32_range(void **state)
{
    (void)state;
    const double values[2] = {1.0, 1e300};
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", values,
                                sizeof values, &size);
    expect_failure(b, size, "element 1");
    free(b);
}

/* NumPy refuses a NUL byte anywhere in the header. Read as C strings, a 'descr' of
 * '<f4\0junk' would pass for '<f4' and a key 'descr\0x' for 'descr'. */
static void nul_byte_in_header(void **state)
{
    (void)state;
    static const char in_descr[] = "{'descr': '<f4\0junk', 'fortran_order': False, 'shape': (1,), }";
    static const char in_key[] = "{'descr\0x': '<f4', 'fortran_order': False, 'shape': (1,), }";
    const char *dicts[2] = {in_descr, in_key};
    const size_t lengths[2] = {sizeof in_descr - 1, sizeof in_key - 1};
    for (int i = 0; i < 2; i++) {
        size_t size;
        unsigned char *b = make_npy_text(1, dicts[i], lengths[i], "abcd", 4, &size);
        expect_failure(b, size, "NUL byte");
        free(b);
    }
}

/* ---- Paths that are not regular files ----------------------------------------------------- */

/* Opening a FIFO for reading waits for a writer, so the failure shows as a hang: the alarm's
 * default action ends the test then. */
static void read_refuses_fifo(void **state)
{
    (void)state;
    char path[512], err[256] = "";
    tf_path(path, sizeof path, "in_fifo.npy");
    assert_int_equal(mkfifo(path, 0600), 0);
    npy_array a;
    alarm(20);
    int rc = npy_read(path, &a, err, sizeof err);
    alarm(0);
    unlink(path);
    assert_int_equal(rc, -1);
    assert_null(a.data);
    tf_expect_mentions(err, "is a FIFO");
}

/* Read-only opens of /dev/null and of a directory: nothing there can be harmed. */
static void read_refuses_device_and_directory(void **state)
{
    (void)state;
    char err[256] = "";
    npy_array a;
    assert_int_equal(npy_read("/dev/null", &a, err, sizeof err), -1);
    tf_expect_mentions(err, "is a character device");
    assert_int_equal(npy_read(tf_dir, &a, err, sizeof err), -1);
    tf_expect_mentions(err, "is a directory");
}

/* Every prefix and every single-byte change of a valid image: success or a message, no crash
 * (run it under a sanitizer to catch out-of-bounds reads too). */
static void mutations_never_crash(void **state)
{
    (void)state;
    const float values[6] = {1, 2, 3, 4, 5, 6};
    size_t size;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", values,
                                sizeof values, &size);
    char err[256];
    npy_array a;
    for (size_t len = 0; len <= size; len++) {
        unsigned char *copy = malloc(len ? len : 1); /* exact size, so overreads are visible */
        assert_non_null(copy);
        memcpy(copy, b, len);
        err[0] = '\0';
        int rc = npy_parse(copy, len, &a, err, sizeof err);
        assert_true(rc == 0 ? len == size : err[0] != '\0');
        npy_free(&a);
        free(copy);
    }
    static const unsigned char replacements[] = {0, '\'', '(', ')', ',', '9', '{', '}', 0xff};
    for (size_t i = 0; i < size; i++) {
        for (size_t k = 0; k < sizeof replacements; k++) {
            unsigned char saved = b[i];
            b[i] = replacements[k];
            err[0] = '\0';
            if (npy_parse(b, size, &a, err, sizeof err) == 0)
                npy_free(&a);
            else
                assert_true(err[0] != '\0');
            b[i] = saved;
        }
    }
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_f4_version1),
        cmocka_unit_test(valid_f8_version2),
        cmocka_unit_test(valid_version3_any_key_order),
        cmocka_unit_test(valid_scalar_and_empty),
        cmocka_unit_test(bad_magic),
        cmocka_unit_test(unsupported_version),
        cmocka_unit_test(truncated_header),
        cmocka_unit_test(header_length_beyond_file),
        cmocka_unit_test(float64_out_of_float32_range),
        cmocka_unit_test(nul_byte_in_header),
        cmocka_unit_test(read_refuses_fifo),
        cmocka_unit_test(read_refuses_device_and_directory),
        cmocka_unit_test(mutations_never_crash),
    };
    const size_t others = sizeof tests / sizeof tests[0], cases = sizeof kDictCases / sizeof kDictCases[0];
    struct CMUnitTest all[sizeof tests / sizeof tests[0] + sizeof kDictCases / sizeof kDictCases[0]];
    memcpy(all, tests, sizeof tests);
    for (size_t i = 0; i < cases; ++i)
        all[others + i] =
            (struct CMUnitTest){kDictCases[i].name, dict_case_refused, NULL, NULL, (void *)&kDictCases[i]};
    return _cmocka_run_group_tests("tests", all, others + cases, tf_group_setup, tf_group_teardown);
}
