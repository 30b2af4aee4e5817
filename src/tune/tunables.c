/* The table of tunable kernels and the device limits their spaces are checked against. */
#include <string.h>

#include "tune/search.h"
#include "tune/tunable.h"

/* Tuning order: CLBlast's GEMM first, where PoCL spends many seconds compiling each candidate and
 * tuning wins most, then attention, then the memory-bound kernels, then decoding and the
 * backward (their own calls, not the forward layer's), then the compact cache's decoding; time a task leaves over goes to the next. */
static const iha_tunable *const tunables[IHA_TUNABLE_COUNT] = {
    &iha__tunable_gemm,     &iha__tunable_attention, &iha__tunable_mix_collapse,
    &iha__tunable_decode,   &iha__tunable_backward,  &iha__tunable_decode_compact,
};

const iha_tunable *iha__tunable_at(int index)
{
    return index >= 0 && index < IHA_TUNABLE_COUNT ? tunables[index] : NULL;
}

const iha_tunable *iha__tunable_find(const char *kernel)
{
    for (int i = 0; i < IHA_TUNABLE_COUNT; ++i)
        if (strcmp(tunables[i]->space->kernel, kernel) == 0) return tunables[i];
    return NULL;
}

void iha__tune_limits(const iha_context *ctx, iha_tune_limits *limits)
{
    limits->max_group = (long)ctx->info.max_work_group_size;
    limits->local_bytes = (long)ctx->info.local_mem_bytes;
    limits->mma = ctx->mma != IHA_MMA_NONE;
}

double iha__tune_tolerance(const iha_tunable *t, const iha_tune_bucket *b, const iha_tune_config *c)
{
    return t->tolerance != NULL ? t->tolerance(b, c) : IHA_TUNE_TOLERANCE;
}
