/*
 * test_builtins.c - every device type's built-in configuration of every tunable kernel lies
 * inside that kernel's tuning space, for every bucket a call can produce. The lookup uses a
 * built-in only if it is valid in the space and otherwise falls back, silently, to the safe
 * configuration, which is correct but far slower: a built-in outside its space would cost
 * speed without any error to show it. Reads private headers of src/ (the tunables and the
 * device type the built-ins follow).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>

#include "runtime/context.h"
#include "test_util.h"
#include "tune/tunable.h"

static const size_t head_dims[] = {1, 3, 8, 16, 24, 64, 100, 128, 129, 200, 256};
static const size_t pseudos[] = {1, 2, 4};
static const size_t tokens[] = {7, 1024};

/* Checks one call's bucket of every tunable; returns how many built-ins were checked. */
static int check_call(const iha_shape *shape, const iha_attention_options *o, const iha_tune_limits *limits)
{
    int checked = 0;
    for (int i = 0; i < IHA_TUNABLE_COUNT; i++) {
        const iha_tunable *t = iha__tunable_at(i);
        iha_tune_bucket bucket;
        iha_tune_config config;
        if (!t->bucket_of(tu_ctx, shape, o, &bucket) || !t->builtin(tu_ctx, &bucket, &config))
            continue;
        const char *why = NULL;
        if (!iha__space_valid(t->space, &config, &bucket, limits, &why)) {
            char b[256], c[512];
            iha__bucket_format(t->space, &bucket, b, sizeof b);
            iha__space_format(t->space, &config, c, sizeof c);
            fail_msg("%s built-in for a %s is outside its space (%s), bucket %s: %s", t->space->kernel,
                     tu_ctx->info.is_gpu ? "GPU" : "CPU", why ? why : "?", b, c);
        }
        checked++;
    }
    return checked;
}

static void builtins_are_inside_their_spaces(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_tune_limits limits;
    iha__tune_limits(tu_ctx, &limits);
    const int native_gpu = tu_ctx->info.is_gpu, native_cpu = tu_ctx->info.is_cpu;
    int checked = 0;
    for (int gpu = 0; gpu < 2; gpu++) {
        tu_ctx->info.is_gpu = gpu;
        tu_ctx->info.is_cpu = !gpu;
        for (size_t di = 0; di < sizeof head_dims / sizeof head_dims[0]; di++)
            for (size_t pi = 0; pi < sizeof pseudos / sizeof pseudos[0]; pi++)
                for (size_t ni = 0; ni < sizeof tokens / sizeof tokens[0]; ni++)
                    for (int variant = 0; variant < 4; variant++) {
                        const iha_shape shape = {.batch = 1, .tokens = tokens[ni], .model_dim = 64, .heads = 2,
                                                 .head_dim = head_dims[di], .pseudo = pseudos[pi]};
                        iha_attention_options o;
                        iha_attention_options_init(&o);
                        o.mask = variant & 1 ? IHA_MASK_NONE : IHA_MASK_CAUSAL;
                        o.window = variant & 2 ? 3 : 0;
                        o.storage = ni ? IHA_STORAGE_F16 : IHA_STORAGE_F32;
                        checked += check_call(&shape, &o, &limits);
                    }
    }
    tu_ctx->info.is_gpu = native_gpu;
    tu_ctx->info.is_cpu = native_cpu;
    print_message("%d built-in configurations checked\n", checked);
    assert_true(checked > 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(builtins_are_inside_their_spaces),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
