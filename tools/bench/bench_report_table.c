/* bench_report_table.c - "iha bench" results as an aligned table. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "bench/bench_report.h"
#include "common/json.h"
#include "common/mask_names.h"

/* "  configuration  ATT_ROWS=4 ... (source)", and under the safe fallback a warning that the
 * rate is not the kernel's: a fallback's speed is easily mistaken for the kernel's. */
static void print_choice(const bench_choice *c)
{
    if (!c->found) return;
    printf("  configuration  %s\n                 from %s", c->config, report_source_words(c->source));
    if (c->source_bucket[0]) printf(" (%s)", c->source_bucket);
    printf("\n");
    if (c->source == IHA_CONFIG_BUILTIN_SAFE)
        printf("  warning: neither the profile nor the built-in default was usable for this bucket, so the\n"
               "  kernel ran its slow, always-valid configuration; these rates are not the tuned kernel's\n");
}

/* ---- Table ---- */

/* A number in a fixed-width column, or "-" when it is NaN. */
static void cell(double value, int width, int decimals)
{
    if (isnan(value))
        printf(" %*s", width, "-");
    else
        printf(" %*.*f", width, decimals, value);
}


static void print_reading_pair(double first, double second)
{
    if (isnan(first))
        printf("-");
    else
        printf("%.1f", first);
    if (isnan(second))
        printf(" / -");
    else
        printf(" / %.1f", second);
}

/* The two readings of the compute ceilings, "a / b", "-" for one that failed (see
 * bench_ceilings.rechecked). */
static void print_readings(const bench_ceilings *c)
{
    if (!c->rechecked)
        return;
    printf("  compute ceilings read at the start / at the end of the run (the faster is used above): peak FMA ");
    print_reading_pair(report_reading_rate(c->peak_fma_readings[0]), report_reading_rate(c->peak_fma_readings[1]));
    printf(", CLBlast %zu^3 ", c->clblast_square.m);
    print_reading_pair(report_reading_gflops(&c->clblast_square, c->clblast_square_readings[0]),
                       report_reading_gflops(&c->clblast_square, c->clblast_square_readings[1]));
    if (c->host_state == BENCH_RAN) {
        printf(", host %zu^3 ", c->host_square.m);
        print_reading_pair(report_reading_gflops(&c->host_square, c->host_square_readings[0]),
                           report_reading_gflops(&c->host_square, c->host_square_readings[1]));
    }
    printf(" GFLOP/s\n");
}

static void print_ceilings(const bench_results *r)
{
    const bench_ceilings *c = &r->ceilings;
    printf("\nceilings\n  %-44s %9s %9s %9s\n", "measure", "ms", "GFLOP/s", "GB/s");
    char label[96];
    snprintf(label, sizeof label, "copy kernel, %zu MiB read + written", c->copy_bytes >> 20);
    printf("  %-44s", label);
    cell(NAN, 9, 1), cell(NAN, 9, 1), cell(1e-9 * c->copy_bytes_per_second, 9, 2), printf("\n");
    const bench_gemm *gemms[2] = {&c->clblast_square, &c->clblast_projection};
    for (int i = 0; i < 2; i++) {
        snprintf(label, sizeof label, "CLBlast SGEMM %zux%zux%zu%s", gemms[i]->m, gemms[i]->n, gemms[i]->k,
                 i ? " (projection)" : "");
        printf("  %-44s", label);
        cell(1e3 * gemms[i]->seconds, 9, 1), cell(report_gemm_gflops(gemms[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
    }
    const bench_gemm *own[2] = {&c->kernel_projection, &c->kernel_row};
    for (int i = 0; i < 2; i++) {
        snprintf(label, sizeof label, "library SGEMM %zux%zux%zu (cl/gemm.cl)", own[i]->m, own[i]->n, own[i]->k);
        printf("  %-44s", label);
        cell(1e3 * own[i]->seconds, 9, 3), cell(report_gemm_gflops(own[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
    }
    printf("  %-44s", "peak FMA kernel (cl/measure_peak_fma.cl)");
    cell(NAN, 9, 1), cell(c->peak_fma_gflops, 9, 1), cell(NAN, 9, 1), printf("\n");
    if (c->loops_state == BENCH_RAN) {
        printf("  %-44s", "attention loops alone: score, P.V, both");
        printf(" %9s %9.1f %9s  score %.1f, P.V %.1f\n", "-", report_loops_gflops(c), "-", c->loops_score_gflops,
               c->loops_pv_gflops);
    } else if (c->loops_state == BENCH_NOT_RUN) {
        printf("  %-44s %s\n", "attention loops alone", c->loops_note);
    }
    if (c->host_state != BENCH_RAN) {
        printf("  %-44s %s\n", "host SGEMM (CBLAS)", c->host_note);
    } else {
        const bench_gemm *host[2] = {&c->host_square, &c->host_projection};
        for (int i = 0; i < 2; i++) {
            snprintf(label, sizeof label, "host SGEMM %zux%zux%zu (%.32s)", host[i]->m, host[i]->n, host[i]->k,
                     c->host_note);
            printf("  %-44s", label);
            cell(1e3 * host[i]->seconds, 9, 1), cell(report_gemm_gflops(host[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
        }
        if (c->host_core[0])
            printf("  %-44s %s\n", "host SGEMM's OpenBLAS core", c->host_core);
        if (c->host_warning[0])
            printf("  warning: %s\n", c->host_warning);
    }
    print_readings(c);
}

static void print_core(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->core;
    char mask[128];
    report_describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\nattention core: B=%zu H=%zu N=%zu P=%zu (T=%zu) d=%zu, %s\n", s->batch, s->heads, s->tokens, s->pseudo,
           s->tokens * s->pseudo, s->head_dim, mask);
    printf("  %-34s %9s %9s %9s %9s %9s\n", "kernel", "ms", "GFLOP", "GFLOP/s", "MB moved", "GB/s");
    const bench_core *c = &r->core;
    printf("  %-34s", "fused (iha_attention)");
    cell(1e3 * c->seconds, 9, 1), cell(1e-9 * c->flops, 9, 2), cell(report_rate(1e-9 * c->flops, c->seconds), 9, 1);
    cell(1e-6 * c->bytes, 9, 1), cell(report_rate(1e-9 * c->bytes, c->seconds), 9, 2), printf("\n");
    const bench_baseline *b = &r->baseline;
    if (b->state == BENCH_RAN) {
        printf("  %-34s", "unfused (GEMM, softmax, GEMM)");
        cell(1e3 * b->seconds, 9, 1), cell(1e-9 * c->flops, 9, 2), cell(report_rate(1e-9 * c->flops, b->seconds), 9, 1);
        cell(NAN, 9, 1), cell(NAN, 9, 1), printf("\n");
        printf("  unfused: %.1f ms per (b, h) sequence (median of %zu runs) x %zu sequences\n",
               1e3 * b->sequence_seconds, cfg->baseline_reps, s->batch * s->heads);
        printf("  fused speed-up over unfused: %.2fx (outputs of %zu sequences differ by relative L2 %.1e)\n",
               report_rate(b->seconds, c->seconds), b->sequences_timed, b->rel_difference);
    } else {
        printf("  %-34s %s\n", "unfused baseline", b->state == BENCH_SKIPPED ? "skipped (--no-baseline)" : b->note);
    }
    print_choice(&c->choice);
    if (!report_ceilings_ran(r))
        return;
    const double g = report_rate(c->flops, c->seconds), bw = report_rate(c->bytes, c->seconds);
    const bench_ceilings *k = &r->ceilings;
    printf("  fused as a fraction of the ceilings: peak FMA %.2f, CLBlast SGEMM %zu^3 %.2f", g / (k->peak_fma_gflops * 1e9),
           k->clblast_square.m, g / (report_gemm_gflops(&k->clblast_square) * 1e9));
    if (report_host_ran(r))
        printf(", host SGEMM %zu^3 %.2f%s", k->host_square.m, g / (report_gemm_gflops(&k->host_square) * 1e9),
               k->host_warning[0] ? " (no ceiling: see its warning)" : "");
    if (report_loops_ran(r))
        printf(", its loops alone %.2f", g / (report_loops_gflops(k) * 1e9));
    printf(", copy bandwidth %.3f\n", bw / k->copy_bytes_per_second);
}

static void print_backward(const bench_results *r)
{
    const bench_backward *b = &r->backward;
    printf("\nattention backward: the core's problem (iha_attention_backward, from one iha_attention call's o, lse)\n");
    if (b->state != BENCH_RAN) {
        printf("  skipped (run with --backward)\n");
        return;
    }
    printf("  %-34s %9s %9s %9s\n", "kernel", "ms", "GFLOP", "GFLOP/s");
    printf("  %-34s", "backward (dQt, dKt, dVt)");
    cell(1e3 * b->seconds, 9, 1), cell(1e-9 * b->flops, 9, 2), cell(report_rate(1e-9 * b->flops, b->seconds), 9, 1);
    printf("\n  FLOPs: 10*d per visible pair, FlashAttention-2's five products (S recomputed, dP, dV, dQ, dK),\n"
           "  2.5x the forward's 4*d\n");
    printf("  backward / forward time: %.2f (forward: the fused core above, %.1f ms)",
           report_rate(b->seconds, b->forward_seconds), 1e3 * b->forward_seconds);
    if (report_ceilings_ran(r))
        printf("; backward as a fraction of peak FMA %.3f",
               report_rate(b->flops, b->seconds) / (r->ceilings.peak_fma_gflops * 1e9));
    printf("\n");
}

static void print_layer(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->layer;
    char mask[128];
    report_describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\nlayer: B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, %s%s (iha_forward, stages timed one by one)\n", s->batch,
           s->tokens, s->model_dim, s->heads, s->head_dim, s->pseudo, mask,
           cfg->bf16 ? ", weights, x and z bfloat16" : cfg->half_weights ? ", weights, x and z half" : "");
    const bench_layer *l = &r->layer;
    if (l->state != BENCH_RAN) {
        printf("  skipped (--no-layer)\n");
        return;
    }
    printf("  %-13s %9s %7s %9s %9s %9s %9s  %s\n", "stage", "ms", "share", "GFLOP", "GFLOP/s", "MB moved", "GB/s",
           "of ceiling");
    stage_row rows[5];
    report_layer_rows(r, rows);
    const char *gemm_label = r->layer.library_gemm ? "library projection GEMM" : "CLBlast projection GEMM";
    const char *const ceiling_labels[] = {gemm_label, "copy bandwidth", "peak FMA", "copy bandwidth", gemm_label};
    for (int i = 0; i < 5; i++) {
        const stage_row *row = &rows[i];
        printf("  %-13s", row->name);
        cell(1e3 * row->seconds, 9, 2), cell(report_rate(row->seconds, l->wall), 7, 3), cell(1e-9 * row->flops, 9, 3);
        cell(report_rate(1e-9 * row->flops, row->seconds), 9, 1);
        cell(row->bytes > 0 ? 1e-6 * row->bytes : NAN, 9, 1);
        cell(row->bytes > 0 ? report_rate(1e-9 * row->bytes, row->seconds) : NAN, 9, 2);
        if (isnan(row->ceiling))
            printf("  -\n");
        else
            printf("  %.2f of %s\n", row->ceiling, ceiling_labels[i]);
    }
    printf("  %-13s", "layer (wall)");
    cell(1e3 * l->wall, 9, 2), cell(1.0, 7, 3), cell(1e-9 * cost_total(&l->flops), 9, 3);
    cell(report_rate(1e-9 * cost_total(&l->flops), l->wall), 9, 1), printf("\n");
    printf("  mixing + collapse: %.1f%% of the layer's time\n",
           100 * report_rate(l->stages.mixing + l->stages.collapse, l->wall));
    if (!l->backward_ran) return;
    const iha_stage_times *b = &l->backward_stages;
    printf("  backward (iha_backward: dx and every weight's gradient, forward recomputed): %.2f ms, %.2f x the "
           "forward\n    stages ms: projections %.2f, mixing %.2f, attention %.2f, collapse %.2f, output %.2f\n",
           1e3 * l->backward_wall, report_rate(l->backward_wall, l->wall), 1e3 * b->projections, 1e3 * b->mixing,
           1e3 * b->attention, 1e3 * b->collapse, 1e3 * b->output);
    printf("  saved pair (iha_forward_save, then iha_backward_saved: the attention forward not recomputed, "
           "%.1f MB saved):\n    forward_save %.2f ms (%.2f x iha_forward), backward_saved %.2f ms (%.2f x "
           "iha_backward); training step %.2f x forward + iha_backward\n",
           1e-6 * l->saved_bytes, 1e3 * l->forward_save_wall, report_rate(l->forward_save_wall, l->wall),
           1e3 * l->backward_saved_wall, report_rate(l->backward_saved_wall, l->backward_wall),
           report_rate(l->forward_save_wall + l->backward_saved_wall, l->wall + l->backward_wall));
}

static void print_cold(const bench_results *r)
{
    printf("\ncold start (child processes, fresh IHA cache dir and driver caches (POCL_CACHE_DIR, CUDA_CACHE_PATH); layer shape above)\n");
    const bench_cold_start *c = &r->cold;
    if (c->state != BENCH_RAN) {
        printf("  %s\n", c->state == BENCH_SKIPPED ? "skipped (--no-cold-start)" : c->note);
        return;
    }
    printf("  %-22s %12s %14s %10s %12s %14s %12s\n", "program caches", "context ms", "1st forward ms", "sum ms",
           "process ms", "2nd forward ms", "start-up ms");
    const bench_cold_run *runs[2] = {&c->empty, &c->warm};
    static const char *const names[2] = {"empty", "warm (new process)"};
    for (int i = 0; i < 2; i++) {
        printf("  %-22s", names[i]);
        cell(1e3 * runs[i]->context_seconds, 12, 1), cell(1e3 * runs[i]->forward_seconds, 14, 1);
        cell(1e3 * (runs[i]->context_seconds + runs[i]->forward_seconds), 10, 1);
        cell(1e3 * runs[i]->process_seconds, 12, 1), cell(1e3 * runs[i]->second_forward_seconds, 14, 1);
        cell(1e3 * (runs[i]->context_seconds + runs[i]->forward_seconds - runs[i]->second_forward_seconds), 12, 1);
        printf("\n");
    }
    printf("  start-up: context and 1st forward less the 2nd forward, the layer's own time; process ms also\n"
           "  counts the child's start and its context's teardown, which writes the programs to the disk cache\n");
}

/* One cache layout's step; name NULL: the only one measured. */
static void print_decode_cache(const bench_config *cfg, const bench_results *r, const bench_decode *d,
                               const char *name)
{
    const iha_shape *s = &cfg->core;
    if (name) printf("  %s\n", name);
    if (d->state != BENCH_RAN) {
        printf("  %s\n", d->note);
        return;
    }
    printf("  step            %9.3f ms  %9.1f tokens/s (B tokens per step)\n", 1e3 * d->step_seconds,
           report_rate((double)s->batch, d->step_seconds));
    printf("  attention       %9.3f ms  reads %.1f MB of cache: %.2f GB/s", 1e3 * d->attention_seconds,
           1e-6 * d->cache_bytes_read, report_rate(1e-9 * d->cache_bytes_read, d->attention_seconds));
    if (report_ceilings_ran(r))
        printf(", %.2f of the copy bandwidth", report_rate(d->cache_bytes_read, d->attention_seconds) /
                                                   r->ceilings.copy_bytes_per_second);
    printf("\n  cache           %.0f bytes per token\n", d->cache_bytes_per_token);
    print_choice(&d->choice);
}

static void print_decode(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->core;
    char mask[128];
    report_describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\ndecoding step: B=%zu H=%zu d=%zu P=%zu D=%zu, %zu cached tokens (%zu virtual) + 1, %s cache, %s weights, "
           "%s\n",
           s->batch, s->heads, s->head_dim, s->pseudo, cfg->layer.model_dim, cfg->decode_tokens,
           cfg->decode_tokens * s->pseudo, cfg->bf16 ? "bfloat16" : cfg->decode_half ? "half" : "float",
           cfg->bf16 ? "bfloat16" : cfg->half_weights ? "half" : "float", mask);
    print_decode_cache(cfg, r, &r->decode, cfg->decode_compact ? "pseudo-token cache" : NULL);
    if (cfg->decode_compact) print_decode_cache(cfg, r, &r->decode_compact, "compact cache");
}

static void print_ring(const bench_config *cfg, const bench_results *r)
{
    const bench_ring *g = &r->ring;
    printf("\ndecoding on a ring cache of %zu tokens (window %lld) beside a cache of every token, one token per "
           "sequence\n",
           cfg->ring_tokens, (long long)cfg->options.window);
    if (g->state != BENCH_RAN) {
        printf("  %s\n", g->note);
        return;
    }
    printf("  %14s  %14s  %14s  %14s  %14s\n", "cached tokens", "ring step ms", "ring bytes", "full step ms",
           "full bytes");
    for (size_t i = 0; i < BENCH_RING_POSITIONS; ++i) {
        const bench_ring_position *at = &g->at[i];
        printf("  %14zu  %14.3f  %14zu  %14.3f  %14zu\n", at->tokens, 1e3 * at->ring_step_seconds,
               at->ring_cache_bytes, 1e3 * at->full_step_seconds, at->full_cache_bytes);
    }
}

static void print_packed(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->core;
    const bench_packed *p = &r->packed;
    char mask[128];
    report_describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\npacked sequences: one row of %zu tokens (T = %zu), H=%zu d=%zu P=%zu, %s; lengths", s->tokens,
           s->tokens * s->pseudo, s->heads, s->head_dim, s->pseudo, mask);
    for (size_t i = 0; i < cfg->seq_count; i++) printf("%s%zu", i ? "," : " ", cfg->seq_lens[i]);
    printf("\n");
    const double d4 = 4.0 * (double)s->head_dim * 1e-9;
    printf("  packed row      %9.3f ms  %8.2f GFLOP/s over its %.0f visible pairs\n", 1e3 * p->packed_seconds,
           report_rate(d4 * p->visible_pairs, p->packed_seconds), p->visible_pairs);
    printf("  one by one      %9.3f ms  %8.2f GFLOP/s (%zu calls)\n", 1e3 * p->separate_seconds,
           report_rate(d4 * p->visible_pairs, p->separate_seconds), cfg->seq_count);
    printf("  packed / one by one  %.3f\n", p->separate_seconds > 0 ? p->packed_seconds / p->separate_seconds : 0.0);
    printf("  unpacked row    %9.3f ms  %8.2f GFLOP/s over %.0f visible pairs (one sequence of %zu tokens)\n",
           1e3 * p->unpacked_seconds, report_rate(d4 * p->unpacked_pairs, p->unpacked_seconds), p->unpacked_pairs,
           s->tokens);
    print_choice(&p->choice);
}

void bench_print_table(const bench_config *c, const bench_results *r)
{
    printf("iha bench (library %s)\n", iha_version_string());
    printf("  device  %s%s\n", r->device, r->device_is_cpu ? " (CPU)" : "");
    printf("  timing  medians of %zu runs after one warm-up run\n", c->reps);
    if (r->load.known)
        printf("  load    host load average (1 min) %.2f at the start, %.2f at the end, %ld CPUs online\n",
               r->load.start, r->load.end, r->load.cpus);
    if (report_ceilings_ran(r))
        print_ceilings(r);
    else
        printf("\nceilings\n  skipped (--no-ceilings)\n");
    if (c->run_decode) {
        print_decode(c, r);
        if (c->ring_tokens) print_ring(c, r);
        printf("\nattention core, unfused baseline, layer, cold start: skipped (--decode)\n");
        return;
    }
    if (c->seq_count) {
        print_packed(c, r);
        printf("\nattention core, unfused baseline, layer, cold start: skipped (--seq-lens)\n");
        return;
    }
    print_core(c, r);
    print_backward(r);
    print_layer(c, r);
    print_cold(r);
}
