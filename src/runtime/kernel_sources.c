/* Lookup in the generated table of embedded kernel sources. */
#include "runtime/kernel_sources.h"

#include <string.h>

const iha_kernel_source *iha__kernel_source_find(const char *name)
{
    for (const iha_kernel_source *s = iha__kernel_sources; s->name != NULL; ++s)
        if (strcmp(s->name, name) == 0) return s;
    return NULL;
}
