/*
 * fail.c - tool_fail of fail.h.
 */
#include "common/fail.h"

#include <stdarg.h>
#include <stdio.h>

int tool_fail(char *err, size_t err_size, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(err, err_size, format, args);
    va_end(args);
    return -1;
}
