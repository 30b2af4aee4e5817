/* Reading a whole file into memory. */
#ifndef IHA_COMMON_FILE_H
#define IHA_COMMON_FILE_H
#include <stddef.h>

/* The file's bytes plus a terminating NUL, malloc'ed (free it), and its length in *length; NULL
 * when it cannot be opened or read, or is larger than `limit` bytes. */
char *iha__read_file(const char *path, size_t limit, size_t *length);
#endif
