/* The state iha_forward_save keeps for iha_backward_saved: the attention step's output O
 * [B][H][T][d], then its log-sum-exp [B][H][T], float32, from the buffer's offset. The layout
 * is private to the library (include/iha.h documents only its size). */
#ifndef IHA_LAYER_SAVED_H
#define IHA_LAYER_SAVED_H
#include "layer/plan.h"

/* B*H*T*d + B*H*T; iha__plan_make has bounded both terms, so the sum does not overflow. */
static inline size_t iha__saved_elements(const iha_plan *p) { return p->virtual_elems + p->lse_elems; }
static inline iha_buffer iha__saved_o(iha_buffer saved) { return saved; }
static inline iha_buffer iha__saved_lse(const iha_plan *p, iha_buffer saved)
{
    return (iha_buffer){saved.mem, saved.offset + p->virtual_elems};
}

/* The checks both calls share: saved given, large enough (float, whatever the storage of the
 * activations and weights), and apart from x and every weight. `other` (z or dz, of x's size
 * and storage) must lie apart from it too. */
iha_status iha__check_saved(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_buffer saved,
                            iha_buffer x, iha_buffer other, const char *other_name, const char *call);
#endif
