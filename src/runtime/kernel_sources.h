/* OpenCL C sources of cl/, embedded at build time (cmake/EmbedKernels.cmake) or read from a
 * developer's directory. */
#ifndef IHA_RUNTIME_KERNEL_SOURCES_H
#define IHA_RUNTIME_KERNEL_SOURCES_H
#include <stddef.h>

typedef struct iha_kernel_source {
    const char *name; /* file name, e.g. "attention.cl" */
    const char *text;
    size_t length;
} iha_kernel_source;

/* Terminated by an entry with name == NULL. Generated. */
extern const iha_kernel_source iha__kernel_sources[];

/* The embedded source named `name`, or NULL. */
const iha_kernel_source *iha__kernel_source_find(const char *name);
#endif
