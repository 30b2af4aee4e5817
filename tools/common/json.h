/*
 * json.h - a small streaming JSON writer for "iha bench --json": nested objects and arrays,
 * commas and indentation handled here, strings escaped (RFC 8259), non-finite numbers written
 * as null (JSON has no NaN or infinity).
 */
#ifndef IHA_TOOLS_JSON_H
#define IHA_TOOLS_JSON_H

#include <stddef.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

typedef struct json_writer {
    FILE *out;
    int depth;
    int has_items[JSON_MAX_DEPTH]; /* whether the open container at each depth has a member yet */
} json_writer;

void json_init(json_writer *w, FILE *out);

/* Every call takes the member's key inside an object and NULL inside an array or at the top. */
void json_begin_object(json_writer *w, const char *key);
void json_end_object(json_writer *w);
void json_begin_array(json_writer *w, const char *key);
void json_end_array(json_writer *w);
/* NULL value writes null. */
void json_string(json_writer *w, const char *key, const char *value);
/* NaN or infinity writes null; whole numbers below 2^53 (FLOP and byte counts) in full,
 * others with 6 significant digits. */
void json_number(json_writer *w, const char *key, double value);
void json_size(json_writer *w, const char *key, size_t value);
void json_bool(json_writer *w, const char *key, int value);
void json_null(json_writer *w, const char *key);

#endif
