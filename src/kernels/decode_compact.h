/* Decoding from a compact KV cache: the new tokens' own keys and values into the cache
 * (cl/decode_mix.cl, decode_store_compact) and split-token attention that forms the pseudo-keys
 * and -values on read (cl/attention_decode_compact.cl; on CPUs
 * cl/attention_decode_compact_lanes.cl). */
#ifndef IHA_KERNELS_DECODE_COMPACT_H
#define IHA_KERNELS_DECODE_COMPACT_H
#include "kernels/decode.h"

/* The compact decode kernel's configuration: a work-item takes `rows` query rows (cut to the
 * step's k*P) of `heads` target heads (cut to H and to a private budget) against one split of
 * the cached tokens; enough work-items for about per_cu per compute unit, but splits of at
 * least min_split_tokens tokens. lanes 1: steps with mixing run
 * cl/attention_decode_compact_lanes.cl (the rows across vector lanes, for CPUs) where its
 * private arrays fit, the others cl/attention_decode_compact.cl. */
/* Splits a row may have (DEC_MAX_SPLITS of cl/decode_combine.clh), and the floats of query rows
 * and accumulators a work-item keeps (heads * rows * d, the heads cut to fit). */
#define IHA_DECODE_COMPACT_MAX_SPLITS 64
#define IHA_DECODE_COMPACT_PRIVATE_FLOATS 4096

typedef struct iha_decode_compact_config {
    int rows;
    int heads;
    int vec; /* DEC_VD: 4, 8 or 16 */
    int min_split_tokens;
    int per_cu;
    int lanes;
} iha_decode_compact_config;

void iha__decode_compact_config_default(const iha_context *ctx, iha_decode_compact_config *cfg);

/* A step on a compact cache: dd as for the pseudo-token cache (t_cur the longest virtual length
 * after the step, on a ring at most slots * P), slots the cache's tokens per sequence. */
typedef struct iha_decode_compact {
    iha_decode_dims dd;
    size_t slots;
    iha_decode_compact_config cfg; /* rows 0: iha__decode_compact_config_default */
    int fold;                      /* 1: the step runs iha__decode_compact_fold_enqueue */
} iha_decode_compact;

/* The new tokens' K and V [B][k][H][d] into the cache at their tokens' slots; with rope (the
 * rotary table of virtual positions, or on a ring the step's rotary rows, see cl/decode_mix.cl)
 * each key rotated by its token's first virtual position n*P. */
iha_status iha__decode_store_compact_enqueue(iha_context *ctx, const iha_decode_compact *dc, cl_mem k, cl_mem v,
                                             cl_mem keys, cl_mem values, cl_mem rope, cl_mem step);

size_t iha__decode_compact_splits(const iha_context *ctx, const iha_decode_compact *dc);
size_t iha__decode_compact_partial_elements(const iha_context *ctx, const iha_decode_compact *dc);

/* Split-token attention of q rows [B][H][k*P][d] against the compact cache -> o rows of the same
 * shape; q_raw the step's rows before mixing, [B][k][H][d], of which q is the mixing by alpha_q
 * (and rotary); alpha_q, alpha_k and alpha_v as the layer's (mem NULL: identity). angles: with
 * rotary (keys stored by iha__decode_store_compact_enqueue with rope), the rotary rows of
 * positions 0 .. P-1, [P][2][d/2]; NULL without. */
iha_status iha__decode_compact_attention_enqueue(iha_context *ctx, const iha_decode_compact *dc, iha_buffer q,
                                                 iha_buffer q_raw, cl_mem keys, cl_mem values, iha_buffer alpha_q,
                                                 iha_buffer alpha_k, iha_buffer alpha_v, cl_mem angles,
                                                 cl_mem partial, iha_buffer o, cl_mem step, int mask, size_t window,
                                                 float scale);

/* Whether a step folds the collapse into its attention: one token per sequence (k = 1), mixing
 * present (mixing 1) and cl/attention_decode_compact_lanes.cl chosen for it, with rotary or not
 * (rope). */
int iha__decode_compact_can_fold(const iha_context *ctx, const iha_decode_compact *dc, int rope, int mixing);

/* A folded step (dc->fold; cl/attention_decode_fold.cl): the attention of the step's rows as
 * iha__decode_compact_attention_enqueue's, collapsed by r [H][H][P] -> y [B][1][H][d], what
 * iha__collapse_enqueue makes of that call's o. partial holds
 * iha__decode_compact_partial_elements floats. */
iha_status iha__decode_compact_fold_enqueue(iha_context *ctx, const iha_decode_compact *dc, iha_buffer q,
                                            iha_buffer q_raw, cl_mem keys, cl_mem values, iha_buffer alpha_q,
                                            iha_buffer alpha_k, iha_buffer alpha_v, iha_buffer r, cl_mem angles,
                                            cl_mem partial, iha_buffer y, cl_mem step, int mask, size_t window,
                                            float scale);
#endif
