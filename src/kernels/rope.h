/* The rotary embedding's cos/sin table, kept in the context's workspace between calls. */
#ifndef IHA_KERNELS_ROPE_H
#define IHA_KERNELS_ROPE_H
#include "kernels/tensor.h"

/* The rotary table's workspace slot. */
enum { IHA_WS_ROPE = IHA_WS_KERNELS_BASE, IHA_WS_KERNELS_END };
_Static_assert((int)IHA_WS_KERNELS_END <= (int)IHA_WS_GEMM_BASE, "the kernels' slots overlap the next module's");

/* What the rotary table's slot holds: valid while the slot's generation is the one seen when it
 * was written. */
typedef struct iha_rope_cache {
    size_t first, positions, head_dim;
    float base;
    unsigned long generation;
} iha_rope_cache;

/* Called by iha_context_create and iha_context_free. */
iha_status iha__rope_cache_init(iha_context *ctx);
void iha__rope_cache_free(iha_context *ctx);

/* The rotary cos/sin table [T][2][d/2] for positions first..first+T-1 and head width d (computed
 * in double on the host, cached in the context while first, T, d and base stay the same). A run of
 * a longer sequence (iha_layer_expand's first_token) starts at first > 0; everything else at 0. */
iha_status iha__rope_table(iha_context *ctx, size_t first, size_t T, size_t d, float base, cl_mem *out);

/* The rows of that table for a decoding step's new tokens, into dst as [B][k*P][2][d/2]:
 * row (b, j*P + p) is position (n0 + j)*P + p for step[b] = (n0, count), j < count (other rows
 * are 0). Blocks until dst is written. For caches whose positions outgrow any
 * table (rings). */
iha_status iha__rope_rows(iha_context *ctx, const cl_int *step, size_t B, size_t k, size_t P, size_t d, float base,
                          cl_mem dst);
/* The rows of that table for positions first .. first+T-1 into the start of dst. Blocks until
 * dst is written. For a compact ring cache's angles. */
iha_status iha__rope_write(iha_context *ctx, size_t first, size_t T, size_t d, float base, cl_mem dst);
#endif
