/*
 * layer_check.c - finite check and sampled-row comparison with the float64 reference.
 */
#include "common/layer_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference.h"

size_t layer_check_nonfinite(const float *z, size_t count)
{
    size_t bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += !isfinite(z[i]);
    return bad;
}

/* Evenly spread, strictly increasing row indices from 0 to total-1. */
static size_t pick_rows(size_t total, size_t wanted, size_t *rows)
{
    if (wanted >= total) {
        for (size_t i = 0; i < total; i++)
            rows[i] = i;
        return total;
    }
    size_t n = 0;
    for (size_t i = 0; i < wanted; i++) {
        size_t row = wanted == 1 ? 0 : (size_t)llround((double)i * (double)(total - 1) / (double)(wanted - 1));
        if (n == 0 || row > rows[n - 1])
            rows[n++] = row;
    }
    return n;
}

int layer_check_reference(const iha_shape *s, const iha_attention_options *o, const iha_host_weights *w,
                          const float *x, const float *z, size_t nrows, double *rel_error, size_t *used, char *err,
                          size_t err_size)
{
    size_t total = s->batch * s->tokens; /* fits: x [B][N][D] exists in memory */
    size_t cap = nrows < total ? nrows : total;
    size_t *rows = malloc((cap ? cap : 1) * sizeof *rows);
    double *ref = malloc((cap ? cap : 1) * s->model_dim * sizeof *ref);
    if (!rows || !ref) {
        free(rows);
        free(ref);
        snprintf(err, err_size, "out of memory for the reference rows");
        return -1;
    }
    size_t n = pick_rows(total, cap, rows);
    ref_problem p = {
        .B = s->batch, .N = s->tokens, .D = s->model_dim, .H = s->heads, .d = s->head_dim, .P = s->pseudo,
        .mask = o->mask, .window = (long long)o->window, .scale = o->scale, .rope = o->rope,
        .rope_base = o->rope_base, .x = x, .wq = w->wq, .wk = w->wk, .wv = w->wv, .wo = w->wo,
        .alpha_q = w->alpha_q, .alpha_k = w->alpha_k, .alpha_v = w->alpha_v, .r = w->r,
    };
    int rc = ref_forward(&p, rows, n, ref);
    if (rc != 0) {
        snprintf(err, err_size, "the float64 reference failed (out of memory, or a problem it rejects)");
    } else {
        double diff = 0, norm = 0;
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < s->model_dim; j++) {
                double r = ref[i * s->model_dim + j], e = (double)z[rows[i] * s->model_dim + j] - r;
                diff += e * e;
                norm += r * r;
            }
        }
        /* NaN in z makes diff NaN: report it as such instead of passing a comparison. */
        *rel_error = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        *used = n;
    }
    free(rows);
    free(ref);
    return rc == 0 ? 0 : -1;
}
