/*
 * test_mha.c - plain multi-head attention as the P = 1 case: with identity mixing and collapse
 * (explicit identity alpha/R buffers, and the NULL identity shortcut) iha_forward,
 * iha_forward_host and iha_attention_core equal standard multi-head attention, computed here
 * by a small MHA written directly (per head softmax(Q K^T / sqrt(d)) V), not by ref_forward.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"


/* Standard multi-head attention core on Q, K, V [B][N][H][d]: y [B][N][H][d].
 * causal: key m visible to query n when m <= n; otherwise every key is visible. */
static void mha_core(size_t B, size_t N, size_t H, size_t d, int causal, const double *q, const double *k,
                     const double *v, double *y)
{
    double *w = tu_malloc(N * sizeof *w);
    size_t HD = H * d;
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < H; h++) {
            for (size_t n = 0; n < N; n++) {
                const double *qn = q + (b * N + n) * HD + h * d;
                size_t keys = causal ? n + 1 : N;
                double max = -INFINITY, sum = 0;
                for (size_t m = 0; m < keys; m++) {
                    const double *km = k + (b * N + m) * HD + h * d;
                    double dot = 0;
                    for (size_t c = 0; c < d; c++)
                        dot += qn[c] * km[c];
                    w[m] = dot / sqrt((double)d);
                    max = fmax(max, w[m]);
                }
                for (size_t m = 0; m < keys; m++) {
                    w[m] = exp(w[m] - max);
                    sum += w[m];
                }
                double *yn = y + (b * N + n) * HD + h * d;
                for (size_t c = 0; c < d; c++) {
                    double acc = 0;
                    for (size_t m = 0; m < keys; m++)
                        acc += w[m] * v[(b * N + m) * HD + h * d + c];
                    yn[c] = acc / sum;
                }
            }
        }
    }
    free(w);
}

/* out [rows][cols] = in [rows][inner] (double) times w [inner][cols] (float). */
static void matmul(const double *in, const float *w, size_t rows, size_t inner, size_t cols, double *out)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            double acc = 0;
            for (size_t c = 0; c < inner; c++)
                acc += in[i * inner + c] * w[c * cols + j];
            out[i * cols + j] = acc;
        }
}

/* Z of a layer computed as standard MHA, ignoring the layer's mixing arrays. */
static double *mha_layer(const tu_layer *l, int causal)
{
    const iha_shape *s = &l->shape;
    size_t rows = s->batch * s->tokens, D = s->model_dim, HD = s->heads * s->head_dim;
    double *x = tu_malloc(rows * D * sizeof *x);
    double *q = tu_malloc(rows * HD * sizeof *q), *k = tu_malloc(rows * HD * sizeof *k);
    double *v = tu_malloc(rows * HD * sizeof *v), *y = tu_malloc(rows * HD * sizeof *y);
    double *z = tu_malloc(rows * D * sizeof *z);
    for (size_t i = 0; i < rows * D; i++)
        x[i] = l->x[i];
    matmul(x, l->wq, rows, D, HD, q);
    matmul(x, l->wk, rows, D, HD, k);
    matmul(x, l->wv, rows, D, HD, v);
    mha_core(s->batch, s->tokens, s->heads, s->head_dim, causal, q, k, v, y);
    matmul(y, l->wo, rows, HD, D, z);
    free(x);
    free(q);
    free(k);
    free(v);
    free(y);
    return z;
}

/* One P = 1 layer of shape B N D H d (identity mixing given `as_null`), run through `api` and
 * compared with MHA: a CMocka case of its own name. */
typedef struct mha_case {
    const char *name;
    size_t B, N, D, H, d;
    int mask, as_null;
    tu_api api;
    uint64_t seed;
} mha_case;

static const mha_case kCases[] = {
    {"mha_explicit_identity_device", 2, 33, 48, 3, 16, IHA_MASK_CAUSAL, 0, TU_API_DEVICE, 1},
    {"mha_null_identity_device", 2, 33, 48, 3, 16, IHA_MASK_CAUSAL, 1, TU_API_DEVICE, 1},
    {"mha_explicit_identity_host", 1, 70, 32, 4, 64, IHA_MASK_CAUSAL, 0, TU_API_HOST, 2},
    {"mha_null_identity_host", 1, 70, 32, 4, 64, IHA_MASK_CAUSAL, 1, TU_API_HOST, 2},
    {"mha_null_identity_offsets_odd_head_width", 2, 57, 20, 2, 59, IHA_MASK_CAUSAL, 1, TU_API_DEVICE_OFFSETS, 3},
    /* With P = 1 every token has one pseudo-token: token_causal is the causal mask. */
    {"mha_token_causal_is_causal", 1, 41, 24, 2, 40, IHA_MASK_TOKEN_CAUSAL, 1, TU_API_DEVICE, 4},
    {"mha_bidirectional", 2, 29, 24, 3, 40, IHA_MASK_NONE, 0, TU_API_HOST, 5},
};

/* A kCases row, *state. */
static void check_mha(void **state)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    const mha_case *c = *state;
    iha_shape shape = {c->B, c->N, c->D, c->H, c->d, 1};
    iha_attention_options options = tu_options(c->mask, 0, 0);
    tu_layer l;
    tu_layer_init(&l, &shape, c->seed);
    tu_layer_identity(&l, c->as_null);
    double *zref = mha_layer(&l, c->mask != IHA_MASK_NONE);
    tu_layer_check_forward(tu_ctx, &l, &options, c->api, zref, TU_TOL_F32);
    free(zref);
    tu_layer_free(&l);
}

/* iha_attention_core with identity mixing is the MHA core on projected Q, K, V. */
static void mha_attention_core(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const size_t B = 2, N = 45, H = 3, d = 64;
    iha_shape shape = {B, N, 1, H, d, 1};
    iha_attention_options options = tu_options(IHA_MASK_CAUSAL, 0, 0);
    size_t n = tu_count_heads(&shape);
    tu_rng rng = tu_rng_seeded(6);
    float *q = tu_random_array(&rng, n, 1.5f), *k = tu_random_array(&rng, n, 1.5f);
    float *v = tu_random_array(&rng, n, 1.0f);
    double *qd = tu_malloc(n * sizeof *qd), *kd = tu_malloc(n * sizeof *kd), *vd = tu_malloc(n * sizeof *vd);
    double *yref = tu_malloc(n * sizeof *yref);
    for (size_t i = 0; i < n; i++) {
        qd[i] = q[i];
        kd[i] = k[i];
        vd[i] = v[i];
    }
    mha_core(B, N, H, d, 1, qd, kd, vd, yref);

    float *eye = tu_malloc(H * H * sizeof *eye);
    for (size_t i = 0; i < H * H; i++)
        eye[i] = i % (H + 1) == 0 ? 1.0f : 0.0f;
    iha_buffer qb = {tu_buffer_guarded(tu_ctx, q, n, 0, 0, 0.0f), 0};
    iha_buffer kb = {tu_buffer_guarded(tu_ctx, k, n, 0, 0, 0.0f), 0};
    iha_buffer vb = {tu_buffer_guarded(tu_ctx, v, n, 0, 0, 0.0f), 0};
    cl_mem eye_mem = tu_buffer_guarded(tu_ctx, eye, H * H, 0, 0, 0.0f);
    for (int as_null = 0; as_null < 2; as_null++) {
        iha_layer_weights w;
        memset(&w, 0, sizeof w);
        if (!as_null)
            w.alpha_q = w.alpha_k = w.alpha_v = w.r = (iha_buffer){eye_mem, 0};
        iha_buffer yb = {tu_buffer_guarded(tu_ctx, NULL, n, 0, TU_GUARD, TU_SENTINEL), 0};
        tu_assert_status(tu_ctx, iha_attention_core(tu_ctx, &shape, &options, &w, qb, kb, vb, yb), IHA_OK);
        tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
        tu_assert_buffer_close(tu_ctx, as_null ? "y (core, NULL identity)" : "y (core, explicit identity)", yb, n,
                               yref, TU_TOL_F32);
        tu_buffer_release(yb.mem);
    }
    tu_buffer_release(qb.mem);
    tu_buffer_release(kb.mem);
    tu_buffer_release(vb.mem);
    tu_buffer_release(eye_mem);
    free(q);
    free(k);
    free(v);
    free(qd);
    free(kd);
    free(vd);
    free(yref);
    free(eye);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest others[] = {cmocka_unit_test(mha_attention_core)};
    const tu_case_table table = {kCases, sizeof kCases[0], sizeof kCases / sizeof kCases[0], check_mha};
    return tu_main_table(argc, argv, &table, others, 1, tu_group_setup, tu_group_teardown);
}
