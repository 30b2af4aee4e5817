/* What npy.c, npy_write.c and npy_sizes.c share: the magic bytes, the element count of a shape,
 * the message helper, the name of a file's kind and the reader's header and file steps. */
#ifndef IHA_TOOLS_NPY_INTERNAL_H
#define IHA_TOOLS_NPY_INTERNAL_H
#include <stddef.h>
#include <stdio.h>
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
/* npy_parse_header, for the integer dtypes (npy_read_sizes) when `integers` is 1. */
int npy__parse_header(const unsigned char *bytes, size_t size, int integers, npy_header *out, char *err,
                      size_t err_size);
/* Opens a regular file for reading (anything else refused with a message); *st is its status. */
FILE *npy__open_regular(const char *path, struct stat *st, char *err, size_t err_size);
/* Reads and parses the header of an open file and seeks to its data. */
int npy__read_header(FILE *f, int integers, npy_header *h, char *err, size_t err_size);
#endif
