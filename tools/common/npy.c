/*
 * npy.c - bounded .npy parsing (header dictionary, float32/float64 data) and reading from
 * regular files; the writer is npy_write.c. See npy.h for the contract; the format is NumPy's
 * NEP 1 ("format.py").
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* open, fstat, fsync, getpid, readlink, fchown: the writer's atomic rename */
#endif
#include "common/npy.h"
#include "common/npy_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const unsigned char npy__magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

int npy__fail(char *err, size_t err_size, const char *format, ...)
{
    if (err && err_size) {
        va_list args;
        va_start(args, format);
        vsnprintf(err, err_size, format, args);
        va_end(args);
    }
    return -1;
}

/* Untrusted header text for a message: printable ASCII as it is, every other byte and the
 * backslash as \xNN, so that a message never carries control bytes to the terminal and says
 * exactly which bytes the file holds. At most EXCERPT_BYTES bytes of input, then "...". */
#define EXCERPT_BYTES 24
#define EXCERPT_SIZE (EXCERPT_BYTES * 4 + 4)

static const char *excerpt(const char *p, const char *end, char buf[EXCERPT_SIZE])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0, taken = 0;
    for (; p < end && taken < EXCERPT_BYTES; taken++) {
        unsigned char c = (unsigned char)*p++;
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            buf[n++] = (char)c;
        } else {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[c >> 4];
            buf[n++] = hex[c & 15];
        }
    }
    if (p < end) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

/* A NUL-terminated string of the header (a key or 'descr') for a message. */
static const char *escaped(const char *s, char buf[EXCERPT_SIZE]) { return excerpt(s, s + strlen(s), buf); }

/* ---- Header dictionary: a tiny parser for the Python literal NumPy writes --------------- */

typedef struct cursor {
    const char *p, *end;
    char *err;
    size_t err_size;
    int integers; /* 1: the dtype is one of the integer types (npy_read_sizes), 0: a float type */
} cursor;

static void skip_space(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int accept_char(cursor *c, char ch)
{
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int accept_word(cursor *c, const char *word)
{
    size_t n = strlen(word);
    skip_space(c);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* A quoted string without escapes (NumPy never writes any in these fields). A NUL byte is
 * refused: Python refuses one anywhere in the header, and it would end the C string early
 * ('<f4\0junk' would read as '<f4'). */
static int parse_string(cursor *c, const char *what, char *out, size_t out_size)
{
    char ex[EXCERPT_SIZE];
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return npy__fail(c->err, c->err_size, "header: %s must be a quoted string, got '%s'", what,
                    excerpt(c->p, c->end, ex));
    char quote = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != quote) {
        if (*c->p == '\0')
            return npy__fail(c->err, c->err_size, "header: %s string contains a NUL byte", what);
        if (*c->p == '\\' || n + 1 >= out_size)
            return npy__fail(c->err, c->err_size, "header: %s string is malformed or too long", what);
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return npy__fail(c->err, c->err_size, "header: %s string is not terminated", what);
    c->p++;
    out[n] = '\0';
    return 0;
}

static int parse_dimension(cursor *c, size_t *out)
{
    char ex[EXCERPT_SIZE];
    skip_space(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return npy__fail(c->err, c->err_size, "header: bad shape tuple near '%s' (expected a non-negative integer)",
                    excerpt(c->p, c->end, ex));
    size_t value = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        size_t digit = (size_t)(*c->p - '0');
        if (value > (SIZE_MAX - digit) / 10)
            return npy__fail(c->err, c->err_size, "header: shape dimension is too large for this machine");
        value = value * 10 + digit;
        c->p++;
    }
    if (c->p < c->end && *c->p == 'L') /* Python 2 long literal, found in old files */
        c->p++;
    *out = value;
    return 0;
}

/* "()", "(5,)", "(2, 3)" or "(2, 3,)". "(5)" is rejected: in Python it is an int, not a tuple. */
static int parse_shape(cursor *c, npy_header *h)
{
    char ex[EXCERPT_SIZE];
    const char *start = c->p;
    if (!accept_char(c, '('))
        return npy__fail(c->err, c->err_size, "header: 'shape' must be a tuple, got '%s'", excerpt(c->p, c->end, ex));
    h->ndim = 0;
    if (accept_char(c, ')'))
        return 0;
    for (;;) {
        if (h->ndim == NPY_MAX_DIMS)
            return npy__fail(c->err, c->err_size, "header: shape has more than %d dimensions", NPY_MAX_DIMS);
        if (parse_dimension(c, &h->shape[h->ndim]))
            return -1;
        h->ndim++;
        int comma = accept_char(c, ',');
        if (accept_char(c, ')')) {
            if (h->ndim == 1 && !comma)
                return npy__fail(c->err, c->err_size, "header: bad shape tuple '%s' (a 1-tuple needs a trailing comma)",
                            excerpt(start, c->p, ex));
            return 0;
        }
        if (!comma)
            return npy__fail(c->err, c->err_size, "header: bad shape tuple near '%s'", excerpt(c->p, c->end, ex));
    }
}

static int check_integer_descr(cursor *c, const char *descr, npy_header *h)
{
    static const struct {
        const char *name;
        npy_dtype dtype;
    } kinds[4] = {{"<i4", NPY_I32}, {"<i8", NPY_I64}, {"<u4", NPY_U32}, {"<u8", NPY_U64}};
    char ex[EXCERPT_SIZE];
    for (int i = 0; i < 4; i++)
        if (strcmp(descr, kinds[i].name) == 0) {
            h->dtype = kinds[i].dtype;
            return 0;
        }
    return npy__fail(c->err, c->err_size,
                     "dtype '%s' is not supported: need little-endian integers ('<i4', '<i8', '<u4' or '<u8')",
                     escaped(descr, ex));
}

static int check_descr(cursor *c, const char *descr, npy_header *h)
{
    char ex[EXCERPT_SIZE];
    if (c->integers)
        return check_integer_descr(c, descr, h);
    if (strcmp(descr, "<f4") == 0) {
        h->dtype = NPY_F32;
        return 0;
    }
    if (strcmp(descr, "<f8") == 0) {
        h->dtype = NPY_F64;
        return 0;
    }
    if (strcmp(descr, ">f4") == 0 || strcmp(descr, ">f8") == 0)
        return npy__fail(c->err, c->err_size,
                    "dtype '%s' is big-endian, which is not supported: save it little-endian, e.g. a.astype('<f%c')",
                    descr, descr[2]);
    return npy__fail(c->err, c->err_size, "dtype '%s' is not supported: need float32 ('<f4') or float64 ('<f8')",
                escaped(descr, ex));
}

/* The dictionary: exactly the keys descr, fortran_order and shape, in any order, once each. */
static int parse_dictionary(cursor *c, npy_header *h)
{
    char ex[EXCERPT_SIZE];
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!accept_char(c, '{'))
        return npy__fail(c->err, c->err_size, "header: expected a dictionary '{...}', got '%s'", excerpt(c->p, c->end, ex));
    while (!accept_char(c, '}')) {
        char key[32], descr[32];
        if (parse_string(c, "a dictionary key", key, sizeof key))
            return -1;
        if (!accept_char(c, ':'))
            return npy__fail(c->err, c->err_size, "header: expected ':' after key '%s'", escaped(key, ex));
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (parse_string(c, "'descr'", descr, sizeof descr) || check_descr(c, descr, h))
                return -1;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (accept_word(c, "True"))
                return npy__fail(c->err, c->err_size,
                            "fortran_order is True: only C-order arrays are supported (save np.ascontiguousarray(a))");
            if (!accept_word(c, "False"))
                return npy__fail(c->err, c->err_size, "header: 'fortran_order' must be True or False, got '%s'",
                            excerpt(c->p, c->end, ex));
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (parse_shape(c, h))
                return -1;
            have_shape = 1;
        } else {
            return npy__fail(c->err, c->err_size, "header: unexpected or repeated key '%s'", escaped(key, ex));
        }
        if (!accept_char(c, ',')) {
            if (!accept_char(c, '}'))
                return npy__fail(c->err, c->err_size, "header: expected ',' or '}' near '%s'", excerpt(c->p, c->end, ex));
            break;
        }
    }
    skip_space(c);
    if (c->p != c->end)
        return npy__fail(c->err, c->err_size, "header: unexpected text after the dictionary: '%s'", excerpt(c->p, c->end, ex));
    if (!have_descr || !have_order || !have_shape)
        return npy__fail(c->err, c->err_size, "header: missing key '%s'",
                    !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return 0;
}

/* ---- Header ------------------------------------------------------------------------------ */

int npy__element_count(const npy_header *h, size_t *count, char *err, size_t err_size)
{
    size_t n = 1;
    for (size_t i = 0; i < h->ndim; i++) {
        if (h->shape[i] != 0 && n > SIZE_MAX / h->shape[i]) {
            char shape[128];
            npy_format_shape(h->shape, h->ndim, shape, sizeof shape);
            return npy__fail(err, err_size, "shape %s has too many elements (the size overflows)", shape);
        }
        n *= h->shape[i];
    }
    *count = n;
    return 0;
}

int npy_parse_header(const unsigned char *bytes, size_t size, npy_header *out, char *err, size_t err_size)
{
    return npy__parse_header(bytes, size, 0, out, err, err_size);
}

int npy__parse_header(const unsigned char *bytes, size_t size, int integers, npy_header *out, char *err,
                      size_t err_size)
{
    npy_header h;
    memset(&h, 0, sizeof h);
    if (!bytes || !out)
        return npy__fail(err, err_size, "no input");
    if (size == 0)
        return npy__fail(err, err_size, "empty file: not a .npy file");
    if (memcmp(bytes, npy__magic, size < sizeof npy__magic ? size : sizeof npy__magic) != 0)
        return npy__fail(err, err_size, "bad magic: not a .npy file (expected \\x93NUMPY)");
    if (size < 8)
        return npy__fail(err, err_size, "truncated: the file ends inside the magic and version (%zu bytes)", size);
    h.version_major = bytes[6];
    if ((bytes[6] < 1 || bytes[6] > 3) || bytes[7] != 0)
        return npy__fail(err, err_size, "unsupported .npy format version %u.%u (expected 1.0, 2.0 or 3.0)", bytes[6],
                    bytes[7]);
    size_t prefix = h.version_major == 1 ? 10 : 12;
    if (size < prefix)
        return npy__fail(err, err_size, "truncated: the file ends inside the header length field (%zu bytes)", size);
    size_t header_len = (size_t)bytes[8] | (size_t)bytes[9] << 8;
    if (h.version_major > 1)
        header_len |= (size_t)bytes[10] << 16 | (size_t)bytes[11] << 24;
    if (header_len > NPY_MAX_HEADER - prefix)
        return npy__fail(err, err_size, "header length %zu is larger than the %d bytes accepted", header_len,
                    NPY_MAX_HEADER);
    if (header_len > size - prefix)
        return npy__fail(err, err_size, "truncated: header length %zu goes beyond the end of the file (%zu bytes)",
                    header_len, size);
    cursor c = {(const char *)bytes + prefix, (const char *)bytes + prefix + header_len, err, err_size, integers};
    if (parse_dictionary(&c, &h) || npy__element_count(&h, &h.count, err, err_size))
        return -1;
    if (h.count > SIZE_MAX / NPY_DTYPE_BYTES(h.dtype)) {
        char shape[128];
        npy_format_shape(h.shape, h.ndim, shape, sizeof shape);
        return npy__fail(err, err_size, "shape %s has too many elements (the byte size overflows)", shape);
    }
    h.data_bytes = h.count * NPY_DTYPE_BYTES(h.dtype);
    h.data_offset = prefix + header_len;
    *out = h;
    return 0;
}

/* ---- Data ------------------------------------------------------------------------------- */

/* Decodes little-endian bytes whatever the host's byte order. Returns the index of the first
 * float64 value that is finite but overflows float32, or `count` when there is none. */
static size_t convert(const unsigned char *src, npy_dtype dtype, size_t count, float *dst)
{
    for (size_t i = 0; i < count; i++) {
        const unsigned char *b = src + i * NPY_DTYPE_BYTES(dtype);
        if (dtype == NPY_F32) {
            uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            memcpy(&dst[i], &u, sizeof u);
        } else {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--)
                u = u << 8 | b[k];
            double v;
            memcpy(&v, &u, sizeof v);
            dst[i] = (float)v;
            if (isfinite(v) && !isfinite(dst[i]))
                return i;
        }
    }
    return count;
}

static int convert_checked(const unsigned char *src, npy_dtype dtype, size_t count, size_t first_index, float *dst,
                           char *err, size_t err_size)
{
    size_t bad = convert(src, dtype, count, dst);
    if (bad < count)
        return npy__fail(err, err_size, "element %zu does not fit in float32 (|value| > 3.4e38)", first_index + bad);
    return 0;
}

static const char *dtype_name(npy_dtype dtype) { return dtype == NPY_F32 ? "float32" : "float64"; }

static int length_error(const npy_header *h, size_t have, char *err, size_t err_size)
{
    char shape[128];
    npy_format_shape(h->shape, h->ndim, shape, sizeof shape);
    return npy__fail(err, err_size, "data is %zu bytes but shape %s of %s needs %zu bytes (%s)", have, shape,
                dtype_name(h->dtype), h->data_bytes, have < h->data_bytes ? "truncated" : "trailing data");
}

static float *allocate_floats(size_t count)
{
    /* count * 4 cannot overflow: count * element size was checked and is at least as large. */
    return malloc(count ? count * sizeof(float) : 1);
}

int npy_parse(const unsigned char *bytes, size_t size, npy_array *out, char *err, size_t err_size)
{
    if (!out)
        return npy__fail(err, err_size, "no output");
    memset(out, 0, sizeof *out);
    npy_header h;
    if (npy_parse_header(bytes, size, &h, err, err_size))
        return -1;
    if (size - h.data_offset != h.data_bytes)
        return length_error(&h, size - h.data_offset, err, err_size);
    float *data = allocate_floats(h.count);
    if (!data)
        return npy__fail(err, err_size, "out of memory for %zu elements", h.count);
    if (convert_checked(bytes + h.data_offset, h.dtype, h.count, 0, data, err, err_size)) {
        free(data);
        return -1;
    }
    out->header = h;
    out->data = data;
    return 0;
}

/* Reads the magic, the length field and the header itself: at most NPY_MAX_HEADER bytes. */
int npy__read_header(FILE *f, int integers, npy_header *h, char *err, size_t err_size)
{
    unsigned char buf[NPY_MAX_HEADER];
    size_t have = fread(buf, 1, 12, f);
    if (have < 12 && ferror(f))
        return npy__fail(err, err_size, "read error: %s", strerror(errno));
    size_t want = have;
    if (have >= 10 && memcmp(buf, npy__magic, sizeof npy__magic) == 0 && buf[6] >= 1 && buf[6] <= 3 && buf[7] == 0) {
        size_t prefix = buf[6] == 1 ? 10 : 12;
        size_t len = (size_t)buf[8] | (size_t)buf[9] << 8;
        if (buf[6] > 1 && have >= 12)
            len |= (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
        want = len <= NPY_MAX_HEADER - prefix ? prefix + len : have;
    }
    if (want > have) {
        have += fread(buf + have, 1, want - have, f);
        if (have < want && ferror(f))
            return npy__fail(err, err_size, "read error: %s", strerror(errno));
    }
    if (npy__parse_header(buf, have, integers, h, err, err_size))
        return -1;
    /* The first read may have taken bytes past a version-1 header; put the stream at the data. */
    if (fseek(f, (long)h->data_offset, SEEK_SET) != 0)
        return npy__fail(err, err_size, "cannot seek to the data: %s", strerror(errno));
    return 0;
}

static int read_data(FILE *f, const npy_header *h, float *data, char *err, size_t err_size)
{
    unsigned char chunk[1 << 16];
    size_t per_chunk = sizeof chunk / NPY_DTYPE_BYTES(h->dtype), done = 0;
    while (done < h->count) {
        size_t n = h->count - done < per_chunk ? h->count - done : per_chunk;
        size_t got = fread(chunk, NPY_DTYPE_BYTES(h->dtype), n, f);
        if (got < n) {
            if (ferror(f))
                return npy__fail(err, err_size, "read error: %s", strerror(errno));
            return length_error(h, (done + got) * NPY_DTYPE_BYTES(h->dtype), err, err_size);
        }
        if (convert_checked(chunk, h->dtype, n, done, data + done, err, err_size))
            return -1;
        done += n;
    }
    if (fgetc(f) != EOF)
        return npy__fail(err, err_size, "trailing data after the %zu bytes that the shape needs", h->data_bytes);
    return 0;
}

/* "a FIFO", "a directory", ...: what a path names, for refusals. */
const char *npy__file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISDIR(mode))
        return "a directory";
    return "not a regular file";
}

/* Opens a regular file for reading. O_NONBLOCK keeps the open of a FIFO from waiting for a
 * writer (forever, when none comes) before fstat can refuse it; it is cleared afterwards so
 * reads block as usual. */
FILE *npy__open_regular(const char *path, struct stat *st, char *err, size_t err_size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        npy__fail(err, err_size, "cannot open: %s", strerror(errno));
        return NULL;
    }
    int flags;
    if (fstat(fd, st) != 0 || (flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        npy__fail(err, err_size, "cannot examine: %s", strerror(errno));
    } else if (!S_ISREG(st->st_mode)) {
        npy__fail(err, err_size, "is %s, not a regular .npy file", npy__file_kind(st->st_mode));
    } else {
        FILE *f = fdopen(fd, "rb");
        if (f)
            return f;
        npy__fail(err, err_size, "cannot open: %s", strerror(errno));
    }
    close(fd);
    return NULL;
}

int npy_read(const char *path, npy_array *out, char *err, size_t err_size)
{
    if (!out)
        return npy__fail(err, err_size, "no output");
    memset(out, 0, sizeof *out);
    struct stat st;
    FILE *f = npy__open_regular(path, &st, err, err_size);
    if (!f)
        return -1;
    npy_header h;
    float *data = NULL;
    int rc = -1;
    if (npy__read_header(f, 0, &h, err, err_size))
        goto done;
    /* Check the length before allocating, so a forged shape cannot make us allocate much. */
    uintmax_t file_size = (uintmax_t)st.st_size;
    if (file_size < h.data_offset || file_size - h.data_offset != h.data_bytes) {
        length_error(&h, file_size < h.data_offset ? 0 : (size_t)(file_size - h.data_offset), err, err_size);
        goto done;
    }
    data = allocate_floats(h.count);
    if (!data) {
        npy__fail(err, err_size, "out of memory for %zu elements", h.count);
        goto done;
    }
    if (read_data(f, &h, data, err, err_size))
        goto done;
    out->header = h;
    out->data = data;
    data = NULL;
    rc = 0;
done:
    free(data);
    fclose(f);
    return rc;
}

void npy_free(npy_array *array)
{
    if (!array)
        return;
    free(array->data);
    memset(array, 0, sizeof *array);
}

/* ---- Writer ----------------------------------------------------------------------------- */

void npy_format_shape(const size_t *shape, size_t ndim, char *buf, size_t buf_size)
{
    size_t used = 0;
    if (!buf_size)
        return;
    snprintf(buf, buf_size, "()");
    for (size_t i = 0; i <= ndim && ndim && used < buf_size; i++) {
        int n = i == ndim ? snprintf(buf + used, buf_size - used, ndim == 1 ? ",)" : ")")
                          : snprintf(buf + used, buf_size - used, "%s%zu", i ? ", " : "(", shape[i]);
        if (n < 0)
            return;
        used += (size_t)n;
    }
}
