/* iha_saved_elements and the argument checks that iha_forward_save and iha_backward_saved share
 * (layer/saved.h). */
#include "layer/saved.h"
#include "runtime/error.h"

iha_status iha_saved_elements(iha_context *ctx, const iha_shape *shape, size_t *elements)
{
    if (elements != NULL) *elements = 0;
    IHA_RETURN_ERROR_IF(elements == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "elements is NULL");
    iha_attention_options o;
    iha_attention_options_init(&o);
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, &o, 1, &p));
    *elements = iha__saved_elements(&p);
    return IHA_OK;
}

iha_status iha__check_saved(iha_context *ctx, const iha_plan *p, const iha_layer_weights *w, iha_buffer saved,
                            iha_buffer x, iha_buffer other, const char *other_name, const char *call)
{
    IHA_RETURN_ERROR_IF(saved.mem == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "%s: saved.mem is NULL", call);
    /* The state is float whatever the storage of the activations and weights. */
    const size_t n = iha__saved_elements(p), f = sizeof(float), a = p->act_bytes;
    IHA_FORWARD_IF_ERROR(iha__check_buffer(ctx, saved, n, f, "saved"));
    IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, saved, n, f, x, p->x_elems, a, "saved", "x"));
    IHA_FORWARD_IF_ERROR(iha__check_apart(ctx, saved, n, f, other, p->x_elems, a, "saved", other_name));
    return iha__check_apart_from_weights_bytes(ctx, p, w, 1, saved, n, f, "saved");
}
