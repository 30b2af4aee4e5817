/* Validation of a call's shape, options and buffers, and the sizes derived from them. Every
 * check runs before anything is enqueued, so a refused call writes nothing. */
#ifndef IHA_LAYER_PLAN_H
#define IHA_LAYER_PLAN_H
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/mix.h"

typedef struct iha_plan {
    iha_dims dims;
    size_t D;
    size_t token_elems;    /* B*N*H*d: Q, K, V, Y */
    size_t virtual_elems;  /* B*H*T*d: Qt, Vt, O */
    size_t packed_elems;   /* Kt in the attention kernel's key-block layout */
    size_t lse_elems;      /* B*H*T */
    size_t x_elems;        /* B*N*D: X, Z */
    size_t w_elems;        /* D*H*d: W_Q, W_K, W_V, W_O */
    size_t mix_elems;      /* H*H*P: alpha, R */
    int act_half;          /* options->storage: activations are 16-bit (half or bfloat16) */
    int weight_half;       /* options->weight_storage: weights are 16-bit (half or bfloat16) */
    int act_storage;       /* options->storage, an iha_storage */
    int weight_storage;    /* options->weight_storage, an iha_storage */
    size_t act_bytes;      /* bytes per activation element, 2 or 4 */
    size_t weight_bytes;   /* bytes per weight element, 2 or 4 */
    iha_attention_config attention;
    iha_mix_collapse_config mix_collapse;
    iha_backward_config backward; /* set by iha__plan_choose_backward; zero elsewhere */
    int mask;
    size_t window;         /* tokens; 0 also when the window covers the whole sequence */
    float scale;
    int rope;
    float rope_base;
    size_t rope_first; /* virtual position of row 0: a layer stage's first_token * P, else 0 */
    /* options->seq_lens and seq_count once checked (NULL and 0: each batch row is one
     * sequence); the device's copy is dims.seq_bounds, set by iha__plan_sequences. */
    const size_t *seq_lens;
    size_t seq_count;
} iha_plan;

/* 1 when storage is an iha_storage value. */
int iha__storage_known(int storage);
/* Checks shape and options; with_model_dim also checks and sizes D. Chooses no kernel
 * configuration: attention, mix_collapse and packed_elems are set by one of the two calls below. */
iha_status iha__plan_make(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          int with_model_dim, iha_plan *plan);
/* The opening of a public layer call: iha__call_begin (which sets *mark), then iha__plan_make.
 * rotated_call, when not NULL, names an attention call, whose inputs are already rotated:
 * options->rope must then be 0. */
iha_status iha__call_plan(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                          int with_model_dim, const char *rotated_call, double *mark, iha_plan *plan);
/* For work that is not a layer call (a KV cache's layout, the measurements): looks the
 * configurations up (profile, then built-ins), never tunes, records nothing. */
iha_status iha__plan_lookup(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_plan *plan);
/* For a layer call once every check of its arguments has passed, before its workspace check:
 * chooses the configurations, tuning them first when the context opted into tuning on first
 * use, and records them for iha_context_last_choices. A refused call therefore never tunes. */
iha_status iha__plan_choose(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_plan *plan);
/* iha__plan_choose for a call that runs the attention backward: also chooses (and records) its
 * configuration. */
iha_status iha__plan_choose_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     iha_plan *plan);
/* For a call that honours packed sequences, after iha__plan_choose: uploads the plan's sequence
 * bounds and sets dims.seq_bounds (nothing when there are none). layer/sequences.c. */
iha_status iha__plan_sequences(iha_context *ctx, iha_plan *plan);
/* The 4-byte elements of those device buffers (the bounds, and with rotary the per-row rotary
 * tables), for the calls' memory checks; 0 without packed sequences. */
size_t iha__plan_sequences_elements(const iha_plan *plan);
/* The rotary table the mixing kernels take under the plan (iha__rope_table's from position
 * rope_first, or with packed sequences one per batch row, positions restarting at each
 * sequence); NULL without rotary.
 * layer/sequences.c. */
iha_status iha__plan_rope_table(iha_context *ctx, const iha_plan *plan, cl_mem *table);
/* Checks that buf holds `elems` elements of elem_bytes each from its offset (against
 * CL_MEM_SIZE), and that it belongs to the context. */
iha_status iha__check_buffer(iha_context *ctx, iha_buffer buf, size_t elems, size_t elem_bytes, const char *name);
/* Checks alpha_q, alpha_k, alpha_v and r (all NULL is the P = 1 identity shortcut) and, when
 * with_projections, wq, wk, wv, wo. */
iha_status iha__check_weights(iha_context *ctx, const iha_plan *plan, const iha_layer_weights *w,
                              int with_projections);
/* Refuses an output that overlaps an input in the same cl_mem, comparing byte ranges (the two
 * may differ in element size). Both must have passed iha__check_buffer, so nothing overflows. */
iha_status iha__check_apart(iha_context *ctx, iha_buffer out, size_t out_elems, size_t out_bytes, iha_buffer in,
                            size_t in_elems, size_t in_bytes, const char *out_name, const char *in_name);
/* The same for an output and an input of elem_bytes elements both. */
iha_status iha__check_disjoint(iha_context *ctx, iha_buffer out, size_t out_elems, iha_buffer in, size_t in_elems,
                               size_t elem_bytes, const char *out_name, const char *in_name);
/* The attention calls' inputs and output: in[0..2] and out, each of `elems` elements of
 * elem_bytes, checked for size, and the output apart from every input. */
iha_status iha__check_inputs_output(iha_context *ctx, const iha_buffer in[3], const char *const in_names[3],
                                    iha_buffer out, const char *out_name, size_t elems, size_t elem_bytes);
/* Refuses an output (of activation elements) that overlaps a weight the call reads: the mixing
 * and collapse weights (when given) and, when with_projections, wq, wk, wv and wo. */
iha_status iha__check_apart_from_weights(iha_context *ctx, const iha_plan *plan, const iha_layer_weights *w,
                                         int with_projections, iha_buffer out, size_t out_elems, const char *out_name);
/* The same for an output of out_bytes elements (a gradient in the weights' storage, or the
 * float saved state). */
iha_status iha__check_apart_from_weights_bytes(iha_context *ctx, const iha_plan *plan, const iha_layer_weights *w,
                                               int with_projections, iha_buffer out, size_t out_elems,
                                               size_t out_bytes, const char *out_name);

/* The members of iha_layer_weights a call reads, as bits. */
enum { IHA_READS_WQKV = 1, IHA_READS_WO = 2, IHA_READS_ALPHAS = 4, IHA_READS_R = 8, IHA_READS_ALL = 15 };
/* iha__check_weights for a call that reads only the members `reads` names: those are checked
 * (the mixing members it reads all NULL, the identity shortcut with P = 1, or all given), and
 * *read is *w with the others NULL, for the overlap checks. */
iha_status iha__check_weights_read(iha_context *ctx, const iha_plan *plan, const iha_layer_weights *w, unsigned reads,
                                   iha_layer_weights *read);

/* One tensor argument of a call: its buffer, size in elements of `bytes` each, and name. */
typedef struct iha_arg {
    iha_buffer buf;
    size_t elems, bytes;
    const char *name;
} iha_arg;
/* Checks every input (given, large enough) and every output: given unless outputs_optional
 * (mem NULL: not computed), large enough, apart from every input, from the weights of *read
 * (iha__check_weights_read) and from the outputs before it. */
iha_status iha__check_args(iha_context *ctx, const iha_plan *plan, const iha_layer_weights *read, const iha_arg *in,
                           int in_count, const iha_arg *out, int out_count, int outputs_optional);
#endif
