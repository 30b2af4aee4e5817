/*
 * test_refusals.c - the fixture and checks of test_refusals.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "test_util.h"
#include "test_layer.h"
#include "test_refusals.h"

const iha_shape tr_shape = {1, 5, 8, 2, 4, 2};

cl_mem tr_sentinel_buffer(size_t n)
{
    return tu_buffer_guarded(tu_ctx, NULL, 0, 0, n, TU_SENTINEL);
}

void tr_fixture_init(tr_fixture *f, const iha_shape *shape, int offsets)
{
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_layer_init(&f->layer, shape, 77);
    tu_device_layer_upload(tu_ctx, &f->layer, offsets, &f->dev);
    f->z_total = f->dev.z.offset + tu_count_x(shape) + TU_GUARD;
    tu_buffer_release(f->dev.z.mem);
    f->dev.z.mem = tr_sentinel_buffer(f->z_total);
    f->hw = tu_layer_host_weights(&f->layer);
    f->nz = tu_count_x(shape);
    f->z = tu_malloc(f->nz * sizeof *f->z);
    tu_fill_value(f->z, f->nz, TU_SENTINEL);
    f->big = tr_sentinel_buffer(TR_SPARE);
    f->out = tr_sentinel_buffer(TR_SPARE);
    f->o = tr_default_options();
}

void tr_fixture_free(tr_fixture *f)
{
    tu_buffer_release(f->big);
    tu_buffer_release(f->out);
    free(f->z);
    tu_device_layer_release(&f->dev);
    tu_layer_free(&f->layer);
}

iha_attention_options tr_default_options(void)
{
    iha_attention_options o = tu_options(IHA_MASK_CAUSAL, 0, 0);
    return o;
}

iha_status tr_run_forward(const tr_fixture *f, const iha_shape *shape, const iha_attention_options *o)
{
    return iha_forward(tu_ctx, shape, o, &f->dev.weights, f->dev.x, f->dev.z);
}

void tr_assert_refused(iha_status got, iha_status expected, cl_mem out, size_t n)
{
    tu_assert_status(tu_ctx, got, expected);
    const char *message = iha_context_message(tu_ctx);
    if (!message || !message[0])
        fail_msg("%s came back without a message", iha_status_name(got));
    tu_assert_status(tu_ctx, iha_context_finish(tu_ctx), IHA_OK);
    tu_assert_buffer_all(tu_ctx, out, 0, n, TU_SENTINEL);
}

void tr_assert_refused_either(iha_status got, iha_status a, iha_status b, cl_mem out, size_t n)
{
    tr_assert_refused(got, got == b ? b : a, out, n);
}

void tr_assert_host_untouched(const float *z, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(&z[i], &(float){TU_SENTINEL}, sizeof(float));
}
