/* iha_check: the families in turn, each row's cases folded into one verdict, and the context
 * left as the check found it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"
#include "common/timing.h"
#include "gemm/sgemm.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"
#include "tune/choose.h"
#include "tune/state.h"

void iha_check_options_init(iha_check_options *options)
{
    if (options) memset(options, 0, sizeof *options);
}

void iha__check_row_init(iha_check_row *row, const char *family, const char *config, int source, const char *shape,
                         double limit)
{
    memset(row, 0, sizeof *row);
    snprintf(row->family, sizeof row->family, "%s", family);
    snprintf(row->config, sizeof row->config, "%s", config);
    snprintf(row->shape, sizeof row->shape, "%s", shape);
    row->source = source;
    row->limit = limit;
    row->state = IHA_CHECK_OK;
}

int iha__check_row_case(iha_context *ctx, iha_check_row *row, iha_status st, double error, const char *label)
{
    if (st != IHA_OK) {
        /* A refusal is kept unless the row has already failed; a failure always wins. */
        if (st == IHA_ERROR_UNSUPPORTED && row->state == IHA_CHECK_FAILED) return 0;
        row->state = st == IHA_ERROR_UNSUPPORTED ? IHA_CHECK_UNSUPPORTED : IHA_CHECK_FAILED;
        if (st != IHA_ERROR_UNSUPPORTED) row->error = INFINITY;
        snprintf(row->note, sizeof row->note, "%s: %s: %s", label, iha_status_name(st),
                 iha__message_text(&ctx->message));
        /* A note is one line: of a build log, the first, which names the failure. */
        row->note[strcspn(row->note, "\n")] = '\0';
        iha__message_clear(&ctx->message);
        ctx->cl_error = 0;
        return 0;
    }
    const double e = isnan(error) ? INFINITY : error;
    if (e > row->error || (e == row->error && row->note[0] == '\0')) {
        row->error = e;
        snprintf(row->note, sizeof row->note, "worst: %s", label);
    }
    if (!(e <= row->limit) && row->state != IHA_CHECK_UNSUPPORTED) row->state = IHA_CHECK_FAILED;
    return 1;
}

iha_status iha__check_probe(iha_context *ctx, iha_status st)
{
    int raised = 0;
    const iha_status probed = iha__loop_probe_take(ctx, &raised);
    if (st != IHA_OK) return st;
    if (probed != IHA_OK) return probed;
    if (!raised) return IHA_OK;
    return iha__fail(ctx, IHA_ERROR_UNSUPPORTED, "the driver ended a kernel's loops after %ld iterations in all",
                     ctx->loop_limit);
}

void iha__check_emit(iha_check_run *run, const iha_check_row *row)
{
    iha_check_summary *s = run->summary;
    if (s->rows < run->capacity) run->rows[s->rows] = *row;
    s->rows++;
    s->failed += row->state == IHA_CHECK_FAILED;
    s->unsupported += row->state == IHA_CHECK_UNSUPPORTED;
    if (run->options && run->options->row) run->options->row(row, run->options->user);
}

#define ALL_FAMILIES \
    (IHA_CHECK_ATTENTION | IHA_CHECK_ROWS | IHA_CHECK_DECODE | IHA_CHECK_GEMM | IHA_CHECK_BACKWARD | IHA_CHECK_HALF | \
     IHA_CHECK_BF16 | IHA_CHECK_DECODE_COMPACT)

static iha_status run_families(iha_check_run *run)
{
    const unsigned f = run->families;
    if (f & IHA_CHECK_ATTENTION) IHA_FORWARD_IF_ERROR(iha__check_attention(run));
    if (f & IHA_CHECK_ROWS) IHA_FORWARD_IF_ERROR(iha__check_rows(run));
    if (f & IHA_CHECK_DECODE) IHA_FORWARD_IF_ERROR(iha__check_decode(run));
    if (f & IHA_CHECK_DECODE_COMPACT) IHA_FORWARD_IF_ERROR(iha__check_decode_compact(run));
    if (f & IHA_CHECK_GEMM) IHA_FORWARD_IF_ERROR(iha__check_gemm(run));
    if (f & IHA_CHECK_BACKWARD) {
        IHA_FORWARD_IF_ERROR(iha__check_backward(run, IHA_STORAGE_F32));
        IHA_FORWARD_IF_ERROR(iha__check_layer(run, IHA_STORAGE_F32));
    }
    static const struct {
        unsigned family;
        int storage;
    } sixteen[] = {{IHA_CHECK_HALF, IHA_STORAGE_F16}, {IHA_CHECK_BF16, IHA_STORAGE_BF16}};
    for (size_t i = 0; i < sizeof sixteen / sizeof sixteen[0]; ++i) {
        if (!(f & sixteen[i].family)) continue;
        IHA_FORWARD_IF_ERROR(iha__check_backward(run, sixteen[i].storage));
        IHA_FORWARD_IF_ERROR(iha__check_layer(run, sixteen[i].storage));
    }
    return IHA_OK;
}

iha_status iha_check(iha_context *ctx, const iha_check_options *options, iha_check_row *rows, size_t capacity,
                     iha_check_summary *summary)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    iha__message_clear(&ctx->message);
    ctx->cl_error = 0;
    IHA_RETURN_ERROR_IF(summary == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "summary is NULL");
    memset(summary, 0, sizeof *summary);
    IHA_RETURN_ERROR_IF(rows == NULL && capacity > 0, ctx, IHA_ERROR_INVALID_ARGUMENT, "rows is NULL");
    const unsigned families = options && options->families ? options->families : ALL_FAMILIES;
    IHA_RETURN_ERROR_IF((families & ~ALL_FAMILIES) != 0, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "unknown check families 0x%x", families & ~ALL_FAMILIES);
    IHA_CL_CHECK(ctx, clFinish(ctx->queue), "clFinish");
    const double start = iha__now_seconds();
    iha_check_run run = {ctx, families, options, rows, capacity, summary};

    /* The check's layer calls must neither tune on first use nor become the application's
     * iha_context_last_choices, and the GEMM rows set the backend: all of it is put back. */
    iha_tune_state *ts = ctx->tune;
    const int first_use = ts->first_use;
    iha_kernel_choice choices[IHA_TUNE_CHOICES];
    const size_t choice_count = ts->choice_count;
    memcpy(choices, ts->choices, sizeof choices);
    ts->first_use = 0;
    iha__tune_gemm_ready(ctx);
    const iha_gemm_config gemm = ctx->gemm->config;

    iha_status st = run_families(&run);
    if (clFinish(ctx->queue) != CL_SUCCESS && st == IHA_OK)
        st = iha__fail(ctx, IHA_ERROR_OPENCL, "the queue failed after the check");
    ctx->gemm->config = gemm;
    ts->first_use = first_use;
    ts->choice_count = choice_count;
    memcpy(ts->choices, choices, sizeof choices);
    summary->seconds = iha__now_seconds() - start;
    return iha__call_end(ctx, st);
}
