/*
 * test_stages.c - what tests/test_layer_stages.c and tests/test_layer_stages_backward.c share
 * (test_stages.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_layer.h"
#include "test_stages.h"
#include "test_storage.h"
#include "test_util.h"

const st_case st_cases[ST_CASES] = {
    {{2, 5, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 7, 9, 3, 6, 2}, IHA_MASK_TOKEN_CAUSAL, 3, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 6, 10, 2, 6, 1}, IHA_MASK_NONE, 2, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 1, 0},
    {{2, 9, 16, 2, 16, 1}, IHA_MASK_CAUSAL, 0, 0, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{1, 19, 24, 2, 8, 3}, IHA_MASK_CAUSAL, 5, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 0},
    {{2, 8, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 0, 1, IHA_STORAGE_F32, IHA_STORAGE_F32, 0, 1},
    {{1, 8, 12, 2, 8, 3}, IHA_MASK_CAUSAL, 3, 1, IHA_STORAGE_F16, IHA_STORAGE_F16, 0, 0},
    {{1, 20, 16, 2, 8, 3}, IHA_MASK_TOKEN_CAUSAL, 0, 1, IHA_STORAGE_F16, IHA_STORAGE_F32, 0, 0},
};

/* Two sequences per batch row: N/2 - 1 tokens, then the rest. */
static size_t packed_lens[8];

iha_attention_options st_case_options(const st_case *c)
{
    iha_attention_options o = tu_options(c->mask, c->window, c->rope);
    o.storage = c->act;
    o.weight_storage = c->weight;
    if (c->packed) {
        for (size_t b = 0; b < c->s.batch; ++b) {
            packed_lens[2 * b] = c->s.tokens / 2 - 1;
            packed_lens[2 * b + 1] = c->s.tokens - packed_lens[2 * b];
        }
        o.seq_lens = packed_lens;
        o.seq_count = 2 * c->s.batch;
    }
    return o;
}

/* The options of iha_attention and iha_attention_backward between the stages: the layer's,
 * with rope 0 (the expand stage has rotated the queries and keys). */
iha_attention_options st_attention_options(const iha_attention_options *layer)
{
    iha_attention_options a = *layer;
    a.rope = 0;
    return a;
}

float *st_read(int storage, iha_buffer b, size_t n, const char *what)
{
    float *out = tu_malloc(n * sizeof *out);
    tu_storage_read(storage, b, n, out, what);
    return out;
}

double *st_to_double(const float *x, size_t n)
{
    double *out = tu_malloc(n * sizeof *out);
    for (size_t i = 0; i < n; ++i) out[i] = x[i];
    return out;
}

/* The largest |a - b| over n floats; 0 is bit for bit (no NaN in either: checked elsewhere). */
double st_max_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Rows [first*P, (first + n)*P) of each head of a [1][H][T][d] tensor, as [1][H][n*P][d]. */
float *st_rows_of(const float *t, const iha_shape *s, size_t first, size_t n)
{
    const size_t P = s->pseudo, d = s->head_dim, T = s->tokens * P;
    float *out = tu_malloc(s->heads * n * P * d * sizeof *out);
    for (size_t h = 0; h < s->heads; ++h)
        memcpy(out + h * n * P * d, t + (h * T + first * P) * d, n * P * d * sizeof *out);
    return out;
}

/* Every element of the n floats of b is still NaN (and its guards are untouched). */
void st_assert_unwritten(iha_buffer b, size_t n, const char *what)
{
    float *got = st_read(IHA_STORAGE_F32, b, n, what);
    if (tu_count_nonfinite(got, n) != n) fail_msg("%s was written by a refused call", what);
    free(got);
}

/* A refusal with this status and a message. */
void st_assert_refused(iha_status st, iha_status expected)
{
    tu_assert_status(tu_ctx, st, expected);
    const char *m = iha_context_message(tu_ctx);
    if (m == NULL || m[0] == '\0') fail_msg("a refusal without a message");
}
