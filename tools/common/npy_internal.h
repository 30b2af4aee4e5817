/* What npy.c and npy_write.c share: the magic bytes, the element count of a shape, the
 * message helper and the name of a file's kind. */
#ifndef IHA_TOOLS_NPY_INTERNAL_H
#define IHA_TOOLS_NPY_INTERNAL_H
#include <stddef.h>
#include <sys/stat.h>

#include "common/npy.h"

/* The six bytes every .npy file starts with. */
extern const unsigned char npy__magic[6];
/* Writes the message into err (when err_size > 0) and returns -1. */
int npy__fail(char *err, size_t err_size, const char *format, ...) __attribute__((format(printf, 3, 4)));
/* *count = the product of h's dimensions; -1 with a message when it overflows size_t. */
int npy__element_count(const npy_header *h, size_t *count, char *err, size_t err_size);
/* "a FIFO", "a directory", ...: what a path names, for refusals. */
const char *npy__file_kind(mode_t mode);
#endif
