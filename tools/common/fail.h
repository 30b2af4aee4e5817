/*
 * fail.h - the helpers' way of failing: a message into the caller's buffer and -1, so that
 * the command prints it with its own name.
 */
#ifndef IHA_TOOLS_FAIL_H
#define IHA_TOOLS_FAIL_H

#include <stddef.h>

/* Formats the message into err (err_size bytes, truncated to fit) and returns -1. */
#ifdef __GNUC__
__attribute__((format(printf, 3, 4)))
#endif
int tool_fail(char *err, size_t err_size, const char *format, ...);

#endif
