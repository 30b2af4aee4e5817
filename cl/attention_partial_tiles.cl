/* iha_attention_partial's kernel on devices that are not GPUs: attention_fwd_f32's register
 * tiles (cl/attention.cl) over one key block of a longer sequence, merging each row's result
 * into the running (O, LSE) state (attention_partial_tiles_f32). A file of its own, as
 * cl/measure_attention_loops.cl is, so that programs without partial attention never compile
 * it. */
#define ATT_PARTIAL 1
#include "attention.cl"
