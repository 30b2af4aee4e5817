/* Kernel program text: loading (embedded or from the kernel directory) and include expansion. */
#include "runtime/kernel_text.h"
#include "runtime/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "runtime/kernel_sources.h"

#define MAX_INCLUDE_DEPTH 4

/* Kernel sources are small; a larger file in the kernel directory is a mistake. */
#define MAX_SOURCE_BYTES (16u << 20)

/* Reads cl/`file` from the developer's kernel directory. */
static char *read_source_file(const iha_context *ctx, const char *file, size_t *length)
{
    char path[4200];
    int n = snprintf(path, sizeof path, "%s/%s", ctx->kernel_dir, file);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    return iha__read_file(path, MAX_SOURCE_BYTES, length);
}

/* The raw text of one file, malloc'ed. */
static iha_status load(iha_context *ctx, const char *file, char **text, size_t *length)
{
    if (ctx->kernel_dir != NULL) {
        *text = read_source_file(ctx, file, length);
        IHA_RETURN_ERROR_IF(*text == NULL, ctx, IHA_ERROR_IO, "cannot read kernel source %s/%s", ctx->kernel_dir,
                            file);
        return IHA_OK;
    }
    const iha_kernel_source *embedded = iha__kernel_source_find(file);
    IHA_RETURN_ERROR_IF(embedded == NULL, ctx, IHA_ERROR_BUILD, "no embedded kernel source named %s", file);
    *text = malloc(embedded->length + 1);
    IHA_RETURN_ERROR_IF(*text == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for kernel source %s", file);
    memcpy(*text, embedded->text, embedded->length);
    (*text)[embedded->length] = '\0';
    *length = embedded->length;
    return IHA_OK;
}

/* A growing output string. */
typedef struct text_buffer {
    char *data;
    size_t length, capacity;
    int failed;
} text_buffer;

static void append(text_buffer *b, const char *s, size_t n)
{
    if (b->failed) return;
    if (b->length + n + 1 > b->capacity) {
        size_t cap = b->capacity ? b->capacity : 4096;
        while (cap < b->length + n + 1) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->capacity = cap;
    }
    memcpy(b->data + b->length, s, n);
    b->length += n;
    b->data[b->length] = '\0';
}

/* The name of an `#include "name"` line (leading blanks allowed), or 0. */
static int include_name(const char *line, size_t n, char *name, size_t size)
{
    size_t i = 0;
    while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
    static const char directive[] = "#include \"";
    const size_t d = sizeof directive - 1;
    if (n - i < d || strncmp(line + i, directive, d) != 0) return 0;
    const char *start = line + i + d, *end = memchr(start, '"', n - i - d);
    if (end == NULL || (size_t)(end - start) >= size || end == start) return 0;
    memcpy(name, start, (size_t)(end - start));
    name[end - start] = '\0';
    return 1;
}

static iha_status expand(iha_context *ctx, const char *file, int depth, text_buffer *out)
{
    IHA_RETURN_ERROR_IF(depth > MAX_INCLUDE_DEPTH, ctx, IHA_ERROR_BUILD,
                        "kernel source %s: includes nested more than %d deep", file, MAX_INCLUDE_DEPTH);
    char *text;
    size_t length;
    IHA_FORWARD_IF_ERROR(load(ctx, file, &text, &length));
    iha_status st = IHA_OK;
    size_t line_no = 1;
    for (const char *p = text; p < text + length && st == IHA_OK; ++line_no) {
        const char *nl = memchr(p, '\n', (size_t)(text + length - p));
        const size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(text + length - p);
        char name[128];
        if (include_name(p, n, name, sizeof name)) {
            st = expand(ctx, name, depth + 1, out);
            /* Build logs keep naming the including file's own lines. */
            char mark[160];
            int m = snprintf(mark, sizeof mark, "\n#line %zu \"%s\"\n", line_no + 1, file);
            append(out, mark, (size_t)m);
        } else {
            append(out, p, n);
        }
        p += n;
    }
    free(text);
    if (st == IHA_OK && out->failed) st = iha__fail(ctx, IHA_ERROR_HOST_MEMORY, "out of host memory for kernel source %s", file);
    return st;
}

iha_status iha__kernel_text(iha_context *ctx, const char *file, char **text, size_t *length)
{
    text_buffer b = {NULL, 0, 0, 0};
    iha_status st = expand(ctx, file, 0, &b);
    if (st != IHA_OK || b.data == NULL) {
        free(b.data);
        return st != IHA_OK ? st : iha__fail(ctx, IHA_ERROR_BUILD, "kernel source %s is empty", file);
    }
    *text = b.data;
    *length = b.length;
    return IHA_OK;
}
