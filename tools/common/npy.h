/*
 * npy.h - reader and writer of NumPy .npy files (format versions 1.0, 2.0, 3.0), reduced to
 * what the iha tool exchanges: little-endian float32 or float64 arrays in C order, read into
 * float32 and written as float32.
 *
 * The reader treats its input as hostile (files come from users and from a fuzzer): parsing is
 * bounded by the header length, every size computation is checked for overflow, the header is
 * at most NPY_MAX_HEADER bytes, and the data must have exactly the length the shape implies.
 * Every failure returns -1 with a one-line message naming the problem; nothing aborts.
 */
#ifndef IHA_TOOLS_NPY_H
#define IHA_TOOLS_NPY_H

#include <stddef.h>

/* NumPy's own limit on dimensions (NPY_MAXDIMS before NumPy 2). */
#define NPY_MAX_DIMS 32
/* Longest header accepted, magic and length fields included. NumPy writes a few hundred bytes;
 * the bound keeps a forged length field from making us read or allocate megabytes. */
#define NPY_MAX_HEADER 65536

/* The low byte of a value is the bytes per element (NPY_DTYPE_BYTES). The integer types are read
 * only by npy_read_sizes. */
typedef enum npy_dtype {
    NPY_F32 = 4,
    NPY_F64 = 8,
    NPY_I32 = 0x104,
    NPY_I64 = 0x108,
    NPY_U32 = 0x204,
    NPY_U64 = 0x208
} npy_dtype;
#define NPY_DTYPE_BYTES(t) ((size_t)(t) & 0xffu)

typedef struct npy_header {
    int version_major;                /* 1, 2 or 3 */
    npy_dtype dtype;                  /* element type stored in the file */
    size_t ndim;                      /* 0 for a scalar */
    size_t shape[NPY_MAX_DIMS];
    size_t count;                     /* product of shape (1 for a scalar) */
    size_t data_offset;               /* bytes from the start of the file to the data */
    size_t data_bytes;                /* count * element size */
} npy_header;

typedef struct npy_array {
    npy_header header;
    float *data; /* count floats, owned by the array (NULL when count is 0) */
} npy_array;

/* Parses the header at the start of `bytes` (size bytes long; more may follow). Checks the
 * magic, version, header length and the dictionary ('descr', 'fortran_order', 'shape', no
 * other key, none twice). Does not look at the data. Returns 0, or -1 with a message in err. */
int npy_parse_header(const unsigned char *bytes, size_t size, npy_header *out, char *err, size_t err_size);

/* Parses a whole .npy image held in memory, converting the data to float32. The data must be
 * exactly header.data_bytes long. On success *out owns its data (npy_free). On failure *out
 * holds no memory. Returns 0 or -1 with a message. */
int npy_parse(const unsigned char *bytes, size_t size, npy_array *out, char *err, size_t err_size);

/* Reads a .npy file without holding the raw bytes twice: header first, then the data in
 * chunks, converted to float32. Only a regular file is read: a FIFO, a device or a directory is
 * refused at once, without waiting for a writer. Same checks and ownership as npy_parse; the
 * message does not repeat the path (callers prefix it). */
int npy_read(const char *path, npy_array *out, char *err, size_t err_size);

/* Reads a 1-D .npy file of non-negative integers (little-endian int32, int64, uint32 or
 * uint64, as numpy.save writes np.array([...]); at most max_count of them) into *out (count
 * values, malloc'ed: free it). Same file checks as npy_read. Returns 0, or -1 with a message. */
int npy_read_sizes(const char *path, size_t max_count, size_t **out, size_t *count, char *err, size_t err_size);

/* Releases the data of an array (NULL or an empty array is fine). */
void npy_free(npy_array *array);

/* Writes a float32 C-order .npy file (version 1.0 header) of the given shape. The file written
 * is the one `path` names after following symbolic links (as numpy.save does: a link stays a
 * link), and it must be a regular file or not exist yet: a FIFO, a device, a socket or a
 * directory is refused and left as it is. The data goes to a temporary file beside it, which
 * then replaces it by rename, so a reader never sees a partial file and a failed write leaves
 * the old one; a replaced file keeps its permissions (and its owner, where the process may set
 * it), though hard links to it keep the old content. Returns 0 or -1 with a message. */
int npy_write_f32(const char *path, const size_t *shape, size_t ndim, const float *data, char *err,
                  size_t err_size);

/* Checks, before a long computation, that npy_write_f32 could write to `path`: the same
 * refusals, and that the target's directory is writable. Returns 0 or -1 with a message. */
int npy_check_output(const char *path, char *err, size_t err_size);

/* "(2, 3, 4)" for a shape, as NumPy prints it; for messages. Truncates to buf_size. */
void npy_format_shape(const size_t *shape, size_t ndim, char *buf, size_t buf_size);

#endif
