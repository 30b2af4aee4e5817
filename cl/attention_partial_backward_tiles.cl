/* iha_attention_partial_backward's kernels on devices that are not GPUs: the backward register
 * tiles of cl/attention_backward_tiles.cl over one query block and one key block of a longer
 * sequence (attention_partial_bwd_tiles_f32, then attention_bwd_dq_sum_f32). A file of its own,
 * as cl/attention_partial_tiles.cl is, so that programs without partial attention never compile
 * it. */
#define ATT_PARTIAL 1
#include "attention_backward_tiles.cl"
