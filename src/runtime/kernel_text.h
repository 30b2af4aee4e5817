/* The text of a kernel program: cl/<file>, embedded at build time or read from the developer's
 * kernel directory, with its `#include "name"` lines replaced by cl/<name> (so that kernels share
 * definitions such as the masks' visible intervals without an include path, which embedded
 * sources do not have). */
#ifndef IHA_RUNTIME_KERNEL_TEXT_H
#define IHA_RUNTIME_KERNEL_TEXT_H
#include "runtime/context.h"

/* Stores a malloc'ed, NUL-terminated text in *text (free it) and its length in *length.
 * IHA_ERROR_IO for a file missing from the kernel directory, IHA_ERROR_BUILD for a name that
 * is not embedded or includes nested more than 4 deep, IHA_ERROR_HOST_MEMORY. */
iha_status iha__kernel_text(iha_context *ctx, const char *file, char **text, size_t *length);
#endif
