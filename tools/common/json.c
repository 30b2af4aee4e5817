/*
 * json.c - the writer of json.h.
 */
#include "common/json.h"

#include <math.h>

void json_init(json_writer *w, FILE *out)
{
    w->out = out;
    w->depth = 0;
    w->has_items[0] = 0;
}

static void write_escaped(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        case '\b': fputs("\\b", out); break;
        case '\f': fputs("\\f", out); break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out); /* UTF-8 passes through; device names are ASCII in practice */
        }
    }
    fputc('"', out);
}

/* The comma, newline and indentation before a member, then its key. */
static void begin_member(json_writer *w, const char *key)
{
    if (w->depth > 0) {
        fputs(w->has_items[w->depth] ? ",\n" : "\n", w->out);
        w->has_items[w->depth] = 1;
        for (int i = 0; i < w->depth; i++)
            fputs("  ", w->out);
    }
    if (key) {
        write_escaped(w->out, key);
        fputs(": ", w->out);
    }
}

static void open_container(json_writer *w, const char *key, char bracket)
{
    begin_member(w, key);
    fputc(bracket, w->out);
    if (w->depth + 1 < JSON_MAX_DEPTH)
        w->depth++;
    w->has_items[w->depth] = 0;
}

static void close_container(json_writer *w, char bracket)
{
    int had = w->has_items[w->depth];
    if (w->depth > 0)
        w->depth--;
    if (had) {
        fputc('\n', w->out);
        for (int i = 0; i < w->depth; i++)
            fputs("  ", w->out);
    }
    fputc(bracket, w->out);
    if (w->depth == 0)
        fputc('\n', w->out);
}

void json_begin_object(json_writer *w, const char *key) { open_container(w, key, '{'); }
void json_end_object(json_writer *w) { close_container(w, '}'); }
void json_begin_array(json_writer *w, const char *key) { open_container(w, key, '['); }
void json_end_array(json_writer *w) { close_container(w, ']'); }

void json_string(json_writer *w, const char *key, const char *value)
{
    begin_member(w, key);
    if (value)
        write_escaped(w->out, value);
    else
        fputs("null", w->out);
}

void json_number(json_writer *w, const char *key, double value)
{
    begin_member(w, key);
    if (!isfinite(value))
        fputs("null", w->out);
    else if (value == floor(value) && fabs(value) < 9007199254740992.0) /* 2^53: counts stay exact */
        fprintf(w->out, "%.0f", value);
    else
        fprintf(w->out, "%.6g", value); /* measurements carry no more digits than this */
}

void json_size(json_writer *w, const char *key, size_t value)
{
    begin_member(w, key);
    fprintf(w->out, "%zu", value);
}

void json_bool(json_writer *w, const char *key, int value)
{
    begin_member(w, key);
    fputs(value ? "true" : "false", w->out);
}

void json_null(json_writer *w, const char *key)
{
    begin_member(w, key);
    fputs("null", w->out);
}
