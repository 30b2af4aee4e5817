/* The collapse of pseudo-heads back to heads (cl/collapse.cl). */
#ifndef IHA_KERNELS_COLLAPSE_H
#define IHA_KERNELS_COLLAPSE_H
#include "kernels/mix.h"

/* Collapse (cl/collapse.cl): o [B][H][T][d] -> y [B][N][H][d]. r.mem NULL means identity. */
iha_status iha__collapse_enqueue(iha_context *ctx, const iha_mix_collapse_config *cfg, const iha_dims *dims, iha_buffer o,
                                 iha_buffer r, iha_buffer y);
#endif
