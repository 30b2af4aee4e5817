/* The layer's entry into tuning: the configurations of one call's kernels. */
#ifndef IHA_TUNE_CHOOSE_H
#define IHA_TUNE_CHOOSE_H
#include "gemm/gemm.h"
#include "kernels/attention_backward.h"
#include "kernels/decode.h"
#include "kernels/decode_compact.h"
#include "kernels/mix.h"

/* What iha__tune_choose may do beyond looking configurations up. */
enum {
    IHA_CHOOSE_TUNE = 1,  /* tune them first when the context opted into tuning on first use: only
                             for a layer call whose every check has passed */
    IHA_CHOOSE_RECORD = 2, /* a layer call: the choices become iha_context_last_choices */
    IHA_CHOOSE_FIRST = 4   /* with RECORD, for a call that makes no other choice: the record starts anew */
};

/* Chooses attention's and the mixing/collapse kernels' configurations for a validated call,
 * through the profile's fallback order; flags are IHA_CHOOSE_* bits. */
iha_status iha__tune_choose(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            iha_attention_config *attention, iha_mix_collapse_config *mix_collapse, int flags);

/* Sets up the GEMM backend this context's layer calls use (the profile's, or the device type's
 * built-in), once per context, as the first layer call does; for measurements that should see
 * the same GEMM as the layer. A failure leaves CLBlast's own parameters. */
void iha__tune_gemm_ready(iha_context *ctx);

/* For measuring each backend alone: CLBlast with the parameters of the context's GEMM
 * configuration (applied once; CLBlast's database where there is none), and the library
 * kernel's tile of that configuration (its default where there is none). */
void iha__tune_clblast_ready(iha_context *ctx);
void iha__tune_gemm_own_tile(iha_context *ctx, iha_gemm_config *out);

/* Chooses the decode kernels' configuration (dd->tune) for a validated decoding step whose
 * geometry dd holds (t_cur and the cache's key block set), by the same fallback order, and adds
 * it to the choices of the step (after iha__tune_choose's, which the step's plan made). */
iha_status iha__tune_choose_decode(iha_context *ctx, iha_decode_dims *dd, int mask, size_t window);
/* The same for a step on a compact cache (dc->cfg), rope its rotary setting. */
iha_status iha__tune_choose_decode_compact(iha_context *ctx, iha_decode_compact *dc, int mask, size_t window,
                                           int rope);

/* Chooses the attention backward's configuration for a validated backward call by the same
 * fallback order, tuning it first where the context asked for that (flags as for
 * iha__tune_choose), and with IHA_CHOOSE_RECORD adds it to the call's choices. */
iha_status iha__tune_choose_backward(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                                     int flags, iha_backward_config *out);
#endif
