/*
 * test_npy.c - the .npy reader and writer of the iha tool (tools/npy.c): valid files of every
 * header version and dtype, and malformed ones that must fail with a message naming the
 * problem, from memory (npy_parse) and from a file (npy_read) alike, never crashing; and what
 * the reader and writer do with paths that are not regular files (FIFOs, devices, links).
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

#include "npy.h"

static char temp_dir[256];

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
    snprintf(path, sizeof path, "%s/%s", temp_dir, name);
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

static void writer_round_trip(void **state)
{
    (void)state;
    const size_t shape[3] = {2, 1, 3};
    const float values[6] = {1, 2, 3, -4, 5e-8f, 6e30f};
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/out.npy", temp_dir);
    assert_int_equal(npy_write_f32(path, shape, 3, values, err, sizeof err), 0);
    npy_array a;
    assert_int_equal(npy_read(path, &a, err, sizeof err), 0);
    assert_int_equal(a.header.ndim, 3);
    assert_int_equal(a.header.data_offset % 64, 0); /* NumPy's alignment */
    assert_memory_equal(a.header.shape, shape, sizeof shape);
    assert_memory_equal(a.data, values, sizeof values);
    npy_free(&a);
    unlink(path);
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

static void missing_keys(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, }", 0, "missing key 'shape'");
    expect_dict_failure("{'fortran_order': False, 'shape': (1,), }", 4, "missing key 'descr'");
    expect_dict_failure("{'descr': '<f4', 'shape': (1,), }", 4, "missing key 'fortran_order'");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4, "'extra'");
    expect_dict_failure("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, "repeated");
    expect_dict_failure("'descr': '<f4'", 4, "dictionary");
}

static void bad_descr(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", 4, "'<i4' is not supported");
    expect_dict_failure("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4, "big-endian");
    expect_dict_failure("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", 8, "big-endian");
    expect_dict_failure("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4,
                        "'descr' must be a quoted string");
    expect_dict_failure("{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", 4, "not supported");
}

static void fortran_order_true(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "fortran_order is True");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4, "fortran_order");
}

static void bad_shape_text(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 8, "shape");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", 24, "shape");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", 16, "trailing comma");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", 24, "tuple");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24, "non-negative");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 24, "shape");
}

static void shape_overflow(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }",
                        0, "overflow");
    /* Product fits in size_t, times 8 bytes does not. */
    expect_dict_failure("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", 0, "overflow");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (123456789012345678901234567890,), }", 0,
                        "too large");
    /* A huge but representable shape: refused by length, before anything is allocated. */
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 4, "truncated");
}

static void data_length_mismatch(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, "truncated");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28, "trailing");
    expect_dict_failure("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 12, "needs 24 bytes");
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

/* Messages quote header text with every byte outside printable ASCII as \xNN, so a forged
 * header cannot send escape sequences to the terminal and the message says what the file holds. */
static void control_bytes_escaped(void **state)
{
    (void)state;
    expect_dict_failure("{'descr': '<i\x1b[2J', 'fortran_order': False, 'shape': (1,), }", 4, "'<i\\x1b[2J'");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'a\x07': 1}", 4, "key 'a\\x07'");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (\x9b" "2,), }", 4, "'\\x9b2,)");
    expect_dict_failure("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\x1b]0;x\x07", 4,
                        "'\\x1b]0;x\\x07");
}

/* ---- Paths that are not regular files ----------------------------------------------------- */

static void temp_path(char *path, size_t size, const char *name)
{
    int n = snprintf(path, size, "%s/%s", temp_dir, name);
    assert_true(n > 0 && (size_t)n < size);
}

static void expect_mentions(const char *err, const char *needle)
{
    if (!strstr(err, needle))
        fail_msg("message '%s' does not mention '%s'", err, needle);
}

static const size_t small_shape[1] = {3};
static const float small_values[3] = {1.0f, -2.0f, 0.5f};

/* The file at path holds small_values as a .npy file. */
static void expect_small_file(const char *path)
{
    npy_array a;
    char err[256] = "";
    if (npy_read(path, &a, err, sizeof err))
        fail_msg("npy_read %s: %s", path, err);
    assert_int_equal(a.header.count, 3);
    assert_memory_equal(a.data, small_values, sizeof small_values);
    npy_free(&a);
}

static void write_bytes(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Opening a FIFO for reading waits for a writer, so the failure shows as a hang: the alarm's
 * default action ends the test then. */
static void read_refuses_fifo(void **state)
{
    (void)state;
    char path[512], err[256] = "";
    temp_path(path, sizeof path, "in_fifo.npy");
    assert_int_equal(mkfifo(path, 0600), 0);
    npy_array a;
    alarm(20);
    int rc = npy_read(path, &a, err, sizeof err);
    alarm(0);
    unlink(path);
    assert_int_equal(rc, -1);
    assert_null(a.data);
    expect_mentions(err, "is a FIFO");
}

/* Read-only opens of /dev/null and of a directory: nothing there can be harmed. */
static void read_refuses_device_and_directory(void **state)
{
    (void)state;
    char err[256] = "";
    npy_array a;
    assert_int_equal(npy_read("/dev/null", &a, err, sizeof err), -1);
    expect_mentions(err, "is a character device");
    assert_int_equal(npy_read(temp_dir, &a, err, sizeof err), -1);
    expect_mentions(err, "is a directory");
}

static void write_refuses_fifo_and_directory(void **state)
{
    (void)state;
    char fifo[512], dir[512], err[256] = "";
    struct stat st;
    temp_path(fifo, sizeof fifo, "out_fifo.npy");
    temp_path(dir, sizeof dir, "out_dir.npy");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(npy_check_output(fifo, err, sizeof err), -1);
    expect_mentions(err, "is a FIFO");
    err[0] = '\0';
    assert_int_equal(npy_write_f32(fifo, small_shape, 1, small_values, err, sizeof err), -1);
    expect_mentions(err, "is a FIFO");
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    assert_int_equal(npy_check_output(dir, err, sizeof err), -1);
    expect_mentions(err, "is a directory");
    err[0] = '\0';
    assert_int_equal(npy_write_f32(dir, small_shape, 1, small_values, err, sizeof err), -1);
    expect_mentions(err, "is a directory");
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* A device node of our own in the temporary directory (a twin of /dev/null, 1:3), never one of
 * /dev: a writer that replaced it would replace only the twin. Needs root and CAP_MKNOD. */
static void write_refuses_device_node(void **state)
{
    (void)state;
    char path[512], err[256] = "";
    temp_path(path, sizeof path, "out_device.npy");
    if (geteuid() != 0 || mknod(path, S_IFCHR | 0600, makedev(1, 3)) != 0) {
        print_message("skipped: creating a device node needs root (and CAP_MKNOD)\n");
        skip();
    }
    int rc = npy_write_f32(path, small_shape, 1, small_values, err, sizeof err);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rc, -1);
    expect_mentions(err, "is a character device");
    assert_true(S_ISCHR(st.st_mode));
    assert_true(st.st_rdev == makedev(1, 3));
}

/* As numpy.save, which opens the path: the link stays and its target gets the data, through
 * chains of links and dangling links (which name the file to create). */
static void write_through_symlinks(void **state)
{
    (void)state;
    char real[512], link[512], chain[512], dangling[512], made[512], err[256] = "", target[64];
    struct stat st;
    temp_path(real, sizeof real, "real.npy");
    temp_path(link, sizeof link, "link.npy");
    temp_path(chain, sizeof chain, "chain.npy");
    temp_path(dangling, sizeof dangling, "dangling.npy");
    temp_path(made, sizeof made, "made.npy");
    write_bytes(real, "old content");
    assert_int_equal(symlink("real.npy", link), 0);
    assert_int_equal(symlink(link, chain), 0); /* absolute, to a link */
    assert_int_equal(symlink("made.npy", dangling), 0);
    assert_int_equal(npy_check_output(chain, err, sizeof err), 0);
    const char *links[3] = {link, chain, dangling};
    for (int i = 0; i < 3; i++) {
        if (npy_write_f32(links[i], small_shape, 1, small_values, err, sizeof err))
            fail_msg("npy_write_f32 %s: %s", links[i], err);
        assert_int_equal(lstat(links[i], &st), 0);
        assert_true(S_ISLNK(st.st_mode));
    }
    ssize_t n = readlink(link, target, sizeof target - 1);
    assert_int_equal(n, 8);
    target[n] = '\0';
    assert_string_equal(target, "real.npy");
    expect_small_file(real);
    expect_small_file(made);
    const char *all[5] = {real, link, chain, dangling, made};
    for (int i = 0; i < 5; i++)
        assert_int_equal(unlink(all[i]), 0);
}

/* A replaced file keeps its permissions, and as root its owner: a write in place would. The
 * modes have bits that a new file (0666 less the umask) never gets. */
static void write_keeps_mode_and_owner(void **state)
{
    (void)state;
    static const mode_t modes[3] = {0600, 0750, 0604};
    char path[512], err[256] = "";
    struct stat st;
    temp_path(path, sizeof path, "mode.npy");
    for (int i = 0; i < 3; i++) {
        write_bytes(path, "old content");
        assert_int_equal(chmod(path, modes[i]), 0);
        const int as_root = geteuid() == 0;
        if (as_root)
            assert_int_equal(chown(path, 4321, 4322), 0);
        if (npy_write_f32(path, small_shape, 1, small_values, err, sizeof err))
            fail_msg("npy_write_f32: %s", err);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 07777, modes[i]);
        if (as_root) {
            assert_int_equal(st.st_uid, 4321);
            assert_int_equal(st.st_gid, 4322);
        }
        expect_small_file(path);
    }
    assert_int_equal(unlink(path), 0);
    /* A new file is created as open(2) would, which a later replacement keeps. */
    assert_int_equal(npy_write_f32(path, small_shape, 1, small_values, err, sizeof err), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(unlink(path), 0);
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

static int make_temp_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(temp_dir, sizeof temp_dir, "%s/iha_test_npy_XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(temp_dir) ? 0 : -1;
}

static int remove_temp_dir(void **state)
{
    (void)state;
    return rmdir(temp_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_f4_version1),
        cmocka_unit_test(valid_f8_version2),
        cmocka_unit_test(valid_version3_any_key_order),
        cmocka_unit_test(valid_scalar_and_empty),
        cmocka_unit_test(writer_round_trip),
        cmocka_unit_test(bad_magic),
        cmocka_unit_test(unsupported_version),
        cmocka_unit_test(truncated_header),
        cmocka_unit_test(header_length_beyond_file),
        cmocka_unit_test(missing_keys),
        cmocka_unit_test(bad_descr),
        cmocka_unit_test(fortran_order_true),
        cmocka_unit_test(bad_shape_text),
        cmocka_unit_test(shape_overflow),
        cmocka_unit_test(data_length_mismatch),
        cmocka_unit_test(float64_out_of_float32_range),
        cmocka_unit_test(nul_byte_in_header),
        cmocka_unit_test(control_bytes_escaped),
        cmocka_unit_test(read_refuses_fifo),
        cmocka_unit_test(read_refuses_device_and_directory),
        cmocka_unit_test(write_refuses_fifo_and_directory),
        cmocka_unit_test(write_refuses_device_node),
        cmocka_unit_test(write_through_symlinks),
        cmocka_unit_test(write_keeps_mode_and_owner),
        cmocka_unit_test(mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, make_temp_dir, remove_temp_dir);
}
