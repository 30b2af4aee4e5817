/*
 * npy_sizes.c - npy_read_sizes: a short 1-D .npy array of non-negative integers (packed
 * sequence lengths), read with npy.c's bounded header parser and file checks.
 */
#include "common/npy.h"
#include "common/npy_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Element i of little-endian integer data of type t; -1 when it is negative. */
static int64_t element(const unsigned char *data, npy_dtype t, size_t i)
{
    const size_t bytes = NPY_DTYPE_BYTES(t);
    uint64_t u = 0;
    for (size_t k = bytes; k-- > 0;) u = u << 8 | data[i * bytes + k];
    if (t == NPY_I32) return (int64_t)(int32_t)(uint32_t)u;
    if (t == NPY_I64) return (int64_t)u;
    return u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
}

int npy_read_sizes(const char *path, size_t max_count, size_t **out, size_t *count, char *err, size_t err_size)
{
    if (!out || !count) return npy__fail(err, err_size, "no output");
    *out = NULL;
    *count = 0;
    struct stat st;
    FILE *f = npy__open_regular(path, &st, err, err_size);
    if (!f) return -1;
    npy_header h;
    unsigned char *raw = NULL;
    size_t *values = NULL;
    int rc = -1;
    if (npy__read_header(f, 1, &h, err, err_size)) goto done;
    if (h.ndim != 1) {
        npy__fail(err, err_size, "needs a 1-D array, not %zu dimensions", h.ndim);
        goto done;
    }
    if (h.count == 0 || h.count > max_count) {
        npy__fail(err, err_size, "holds %zu values: needs 1 to %zu", h.count, max_count);
        goto done;
    }
    /* max_count bounds the allocation before the file's length is trusted. */
    raw = malloc(h.data_bytes + 1);
    values = malloc(h.count * sizeof *values);
    if (!raw || !values) {
        npy__fail(err, err_size, "out of memory for %zu values", h.count);
        goto done;
    }
    const size_t got = fread(raw, 1, h.data_bytes + 1, f);
    if (got != h.data_bytes) {
        if (ferror(f))
            npy__fail(err, err_size, "read error: %s", strerror(errno));
        else
            npy__fail(err, err_size, "data is %s the %zu bytes that the shape needs", got < h.data_bytes ? "shorter than" : "longer than",
                      h.data_bytes);
        goto done;
    }
    for (size_t i = 0; i < h.count; i++) {
        const int64_t v = element(raw, h.dtype, i);
        if (v < 0 || (uint64_t)v > SIZE_MAX) {
            npy__fail(err, err_size, "value %zu is %lld: lengths must be non-negative", i, (long long)v);
            goto done;
        }
        values[i] = (size_t)v;
    }
    *out = values;
    *count = h.count;
    values = NULL;
    rc = 0;
done:
    free(raw);
    free(values);
    fclose(f);
    return rc;
}
