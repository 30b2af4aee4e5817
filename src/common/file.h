/* Opening and reading files that the library does not control (cache entries, the tuning
 * profile, kernel sources): never blocking on a FIFO or device, accepting regular files only,
 * and saying why a file could not be used. */
#ifndef IHA_COMMON_FILE_H
#define IHA_COMMON_FILE_H
#include <stddef.h>

/* A failure code of the functions below that is not an errno value: the path names a FIFO,
 * a device, a socket or (with IHA_FILE_NO_FOLLOW) a symbolic link. */
#define IHA_FILE_NOT_REGULAR (-1)
/* Flags of iha__file_open_read and iha__file_read. */
#define IHA_FILE_NO_FOLLOW 1 /* refuse a symbolic link in the last component */

/* "not a regular file" for IHA_FILE_NOT_REGULAR, else strerror(code). */
const char *iha__file_error(int code);

/* Opens path for reading. O_NONBLOCK makes opening a FIFO return at once, and fstat then
 * refuses everything but a regular file, so no caller can hang on a file someone put in the
 * place of one. Returns 0 and the descriptor in *fd, or a code (errno, or IHA_FILE_NOT_REGULAR;
 * EISDIR for a directory). */
int iha__file_open_read(const char *path, int flags, int *fd);

/* The whole file plus a terminating NUL, malloc'ed (free it), and its length. Returns 0 or a
 * code as above; EFBIG when the file holds more than `limit` bytes. */
int iha__file_read(const char *path, size_t limit, int flags, char **text, size_t *length);

/* iha__file_read with flags 0, for callers that only need the text: NULL on failure, with
 * errno set to the code (EINVAL for IHA_FILE_NOT_REGULAR). */
char *iha__read_file(const char *path, size_t limit, size_t *length);
#endif
