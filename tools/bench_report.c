/*
 * bench_report.c - "iha bench" results as an aligned table or as one JSON object (the keys
 * are listed in README.md, section "Benchmarks"). A ratio to a ceiling that was not measured,
 * or a reading that failed, is NaN here, "-" in the table and null in JSON. Every JSON section
 * is present with a "state"; a section that did not run has nothing else but a note saying why.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "bench.h"
#include "json.h"
#include "mask_names.h"

static double rate(double amount, double seconds) { return seconds > 0 ? amount / seconds : NAN; }

static double gemm_gflops(const bench_gemm *g)
{
    return rate(2e-9 * (double)g->m * (double)g->n * (double)g->k, g->seconds);
}

static int ceilings_ran(const bench_results *r) { return r->ceilings.state == BENCH_RAN; }
static int loops_ran(const bench_results *r) { return ceilings_ran(r) && r->ceilings.loops_state == BENCH_RAN; }
/* The two loops run one after the other on every key block: their combined rate. */
static double loops_gflops(const bench_ceilings *c)
{
    return 2.0 / (1.0 / c->loops_score_gflops + 1.0 / c->loops_pv_gflops);
}
static int host_ran(const bench_results *r) { return ceilings_ran(r) && r->ceilings.host_state == BENCH_RAN; }

/* a / b when the ceiling b was measured, else NaN. */
static double fraction(double a, double b, int measured) { return measured && b > 0 ? a / b : NAN; }

static const char *state_name(bench_state s)
{
    return s == BENCH_RAN ? "ran" : s == BENCH_SKIPPED ? "skipped" : "not_run";
}

/* iha_config_source values, as JSON names and as words for the table. */
static const char *source_name(int source)
{
    switch (source) {
    case IHA_CONFIG_PROFILE_EXACT: return "profile_exact";
    case IHA_CONFIG_PROFILE_NEAREST: return "profile_nearest";
    case IHA_CONFIG_PROFILE_DEVICE: return "profile_device_default";
    case IHA_CONFIG_BUILTIN_TYPE: return "builtin";
    case IHA_CONFIG_BUILTIN_SAFE: return "builtin_safe";
    default: return "unknown";
    }
}

static const char *source_words(int source)
{
    switch (source) {
    case IHA_CONFIG_PROFILE_EXACT: return "the tuning profile's entry for this bucket";
    case IHA_CONFIG_PROFILE_NEAREST: return "the tuning profile's nearest bucket";
    case IHA_CONFIG_PROFILE_DEVICE: return "the tuning profile's device-wide default";
    case IHA_CONFIG_BUILTIN_TYPE: return "the built-in default for this device type (no usable profile entry)";
    default: return "the SAFE FALLBACK";
    }
}

/* "  configuration  ATT_ROWS=4 ... (source)", and under the safe fallback a warning that the
 * rate is not the kernel's: a fallback's speed is easily mistaken for the kernel's. */
static void print_choice(const bench_choice *c)
{
    if (!c->found) return;
    printf("  configuration  %s\n                 from %s", c->config, source_words(c->source));
    if (c->source_bucket[0]) printf(" (%s)", c->source_bucket);
    printf("\n");
    if (c->source == IHA_CONFIG_BUILTIN_SAFE)
        printf("  warning: neither the profile nor the built-in default was usable for this bucket, so the\n"
               "  kernel ran its slow, always-valid configuration; these rates are not the tuned kernel's\n");
}

/* config, config_source and config_source_bucket ("" unless the source is a profile bucket);
 * null when the call reported no configuration. */
static void json_choice(json_writer *w, const bench_choice *c)
{
    if (!c->found) {
        json_null(w, "config");
        json_null(w, "config_source");
        json_null(w, "config_source_bucket");
        return;
    }
    json_string(w, "config", c->config);
    json_string(w, "config_source", source_name(c->source));
    json_string(w, "config_source_bucket", c->source_bucket);
}

static void describe_mask(const iha_shape *s, const iha_attention_options *o, char *buf, size_t size)
{
    if (o->window > 0)
        snprintf(buf, size, "mask %s, window %" PRId64 " tokens (%" PRId64 " virtual keys)", mask_names[o->mask],
                 o->window, o->window * (int64_t)s->pseudo);
    else
        snprintf(buf, size, "mask %s, global", mask_names[o->mask]);
}

/* Derived figures of the attention core and each layer stage, shared by both outputs. */
typedef struct stage_row {
    const char *name;
    double seconds, flops, bytes; /* bytes 0: not a memory-bound stage */
    double ceiling;               /* fraction of its ceiling: see ceiling_name */
    const char *ceiling_name;
} stage_row;

static void layer_rows(const bench_results *r, stage_row rows[5])
{
    const bench_layer *l = &r->layer;
    const bench_ceilings *c = &r->ceilings;
    const int ran = ceilings_ran(r);
    /* The projections against the GEMM rate of the backend the layer ran on. */
    const bench_gemm *gemm = l->library_gemm ? &c->kernel_projection : &c->clblast_projection;
    const char *gemm_name = l->library_gemm ? "library_gemm_projection" : "clblast_gemm_projection";
    const double proj = gemm_gflops(gemm) * 1e9, bw = c->copy_bytes_per_second;
    rows[0] = (stage_row){"projections", l->stages.projections, l->flops.projections, 0, 0, gemm_name};
    rows[1] = (stage_row){"mixing", l->stages.mixing, l->flops.mixing, l->mixing_bytes, 0, "copy_bandwidth"};
    rows[2] = (stage_row){"attention", l->stages.attention, l->flops.attention, 0, 0, "peak_fma"};
    rows[3] = (stage_row){"collapse", l->stages.collapse, l->flops.collapse, l->collapse_bytes, 0, "copy_bandwidth"};
    rows[4] = (stage_row){"output", l->stages.output, l->flops.output, 0, 0, gemm_name};
    rows[0].ceiling = fraction(rate(rows[0].flops, rows[0].seconds), proj, ran);
    rows[1].ceiling = fraction(rate(rows[1].bytes, rows[1].seconds), bw, ran);
    rows[2].ceiling = fraction(rate(rows[2].flops, rows[2].seconds), c->peak_fma_gflops * 1e9, ran);
    rows[3].ceiling = fraction(rate(rows[3].bytes, rows[3].seconds), bw, ran);
    rows[4].ceiling = fraction(rate(rows[4].flops, rows[4].seconds), proj, ran);
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

/* GFLOP/s of a reading of g's shape that took `seconds`; NAN for a reading not taken or failed. */
static double reading_gflops(const bench_gemm *g, double seconds)
{
    bench_gemm one = *g;
    one.seconds = seconds;
    return seconds > 0 ? gemm_gflops(&one) : NAN;
}

/* A peak-FMA reading: 0 in bench_ceilings when it failed, NAN here like the GEMM readings. */
static double reading_rate(double gflops) { return gflops > 0 ? gflops : NAN; }

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
    print_reading_pair(reading_rate(c->peak_fma_readings[0]), reading_rate(c->peak_fma_readings[1]));
    printf(", CLBlast %zu^3 ", c->clblast_square.m);
    print_reading_pair(reading_gflops(&c->clblast_square, c->clblast_square_readings[0]),
                       reading_gflops(&c->clblast_square, c->clblast_square_readings[1]));
    if (c->host_state == BENCH_RAN) {
        printf(", host %zu^3 ", c->host_square.m);
        print_reading_pair(reading_gflops(&c->host_square, c->host_square_readings[0]),
                           reading_gflops(&c->host_square, c->host_square_readings[1]));
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
        cell(1e3 * gemms[i]->seconds, 9, 1), cell(gemm_gflops(gemms[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
    }
    const bench_gemm *own[2] = {&c->kernel_projection, &c->kernel_row};
    for (int i = 0; i < 2; i++) {
        snprintf(label, sizeof label, "library SGEMM %zux%zux%zu (cl/gemm.cl)", own[i]->m, own[i]->n, own[i]->k);
        printf("  %-44s", label);
        cell(1e3 * own[i]->seconds, 9, 3), cell(gemm_gflops(own[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
    }
    printf("  %-44s", "peak FMA kernel (cl/measure_peak_fma.cl)");
    cell(NAN, 9, 1), cell(c->peak_fma_gflops, 9, 1), cell(NAN, 9, 1), printf("\n");
    if (c->loops_state == BENCH_RAN) {
        printf("  %-44s", "attention loops alone: score, P.V, both");
        printf(" %9s %9.1f %9s  score %.1f, P.V %.1f\n", "-", loops_gflops(c), "-", c->loops_score_gflops,
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
            cell(1e3 * host[i]->seconds, 9, 1), cell(gemm_gflops(host[i]), 9, 1), cell(NAN, 9, 1), printf("\n");
        }
    }
    print_readings(c);
}

static void print_core(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->core;
    char mask[128];
    describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\nattention core: B=%zu H=%zu N=%zu P=%zu (T=%zu) d=%zu, %s\n", s->batch, s->heads, s->tokens, s->pseudo,
           s->tokens * s->pseudo, s->head_dim, mask);
    printf("  %-34s %9s %9s %9s %9s %9s\n", "kernel", "ms", "GFLOP", "GFLOP/s", "MB moved", "GB/s");
    const bench_core *c = &r->core;
    printf("  %-34s", "fused (iha_attention)");
    cell(1e3 * c->seconds, 9, 1), cell(1e-9 * c->flops, 9, 2), cell(rate(1e-9 * c->flops, c->seconds), 9, 1);
    cell(1e-6 * c->bytes, 9, 1), cell(rate(1e-9 * c->bytes, c->seconds), 9, 2), printf("\n");
    const bench_baseline *b = &r->baseline;
    if (b->state == BENCH_RAN) {
        printf("  %-34s", "unfused (GEMM, softmax, GEMM)");
        cell(1e3 * b->seconds, 9, 1), cell(1e-9 * c->flops, 9, 2), cell(rate(1e-9 * c->flops, b->seconds), 9, 1);
        cell(NAN, 9, 1), cell(NAN, 9, 1), printf("\n");
        printf("  unfused: %.1f ms per (b, h) sequence (median of %zu runs) x %zu sequences\n",
               1e3 * b->sequence_seconds, cfg->baseline_reps, s->batch * s->heads);
        printf("  fused speed-up over unfused: %.2fx (outputs of %zu sequences differ by relative L2 %.1e)\n",
               rate(b->seconds, c->seconds), b->sequences_timed, b->rel_difference);
    } else {
        printf("  %-34s %s\n", "unfused baseline", b->state == BENCH_SKIPPED ? "skipped (--no-baseline)" : b->note);
    }
    print_choice(&c->choice);
    if (!ceilings_ran(r))
        return;
    const double g = rate(c->flops, c->seconds), bw = rate(c->bytes, c->seconds);
    const bench_ceilings *k = &r->ceilings;
    printf("  fused as a fraction of the ceilings: peak FMA %.2f, CLBlast SGEMM %zu^3 %.2f", g / (k->peak_fma_gflops * 1e9),
           k->clblast_square.m, g / (gemm_gflops(&k->clblast_square) * 1e9));
    if (host_ran(r))
        printf(", host SGEMM %zu^3 %.2f", k->host_square.m, g / (gemm_gflops(&k->host_square) * 1e9));
    if (loops_ran(r))
        printf(", its loops alone %.2f", g / (loops_gflops(k) * 1e9));
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
    cell(1e3 * b->seconds, 9, 1), cell(1e-9 * b->flops, 9, 2), cell(rate(1e-9 * b->flops, b->seconds), 9, 1);
    printf("\n  FLOPs: 10*d per visible pair, FlashAttention-2's five products (S recomputed, dP, dV, dQ, dK),\n"
           "  2.5x the forward's 4*d\n");
    printf("  backward / forward time: %.2f (forward: the fused core above, %.1f ms)",
           rate(b->seconds, b->forward_seconds), 1e3 * b->forward_seconds);
    if (ceilings_ran(r))
        printf("; backward as a fraction of peak FMA %.3f",
               rate(b->flops, b->seconds) / (r->ceilings.peak_fma_gflops * 1e9));
    printf("\n");
}

static void print_layer(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->layer;
    char mask[128];
    describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\nlayer: B=%zu N=%zu D=%zu H=%zu d=%zu P=%zu, %s%s (iha_forward, stages timed one by one)\n", s->batch,
           s->tokens, s->model_dim, s->heads, s->head_dim, s->pseudo, mask,
           cfg->half_weights ? ", weights, x and z half" : "");
    const bench_layer *l = &r->layer;
    if (l->state != BENCH_RAN) {
        printf("  skipped (--no-layer)\n");
        return;
    }
    printf("  %-13s %9s %7s %9s %9s %9s %9s  %s\n", "stage", "ms", "share", "GFLOP", "GFLOP/s", "MB moved", "GB/s",
           "of ceiling");
    stage_row rows[5];
    layer_rows(r, rows);
    const char *gemm_label = r->layer.library_gemm ? "library projection GEMM" : "CLBlast projection GEMM";
    const char *const ceiling_labels[] = {gemm_label, "copy bandwidth", "peak FMA", "copy bandwidth", gemm_label};
    for (int i = 0; i < 5; i++) {
        const stage_row *row = &rows[i];
        printf("  %-13s", row->name);
        cell(1e3 * row->seconds, 9, 2), cell(rate(row->seconds, l->wall), 7, 3), cell(1e-9 * row->flops, 9, 3);
        cell(rate(1e-9 * row->flops, row->seconds), 9, 1);
        cell(row->bytes > 0 ? 1e-6 * row->bytes : NAN, 9, 1);
        cell(row->bytes > 0 ? rate(1e-9 * row->bytes, row->seconds) : NAN, 9, 2);
        if (isnan(row->ceiling))
            printf("  -\n");
        else
            printf("  %.2f of %s\n", row->ceiling, ceiling_labels[i]);
    }
    printf("  %-13s", "layer (wall)");
    cell(1e3 * l->wall, 9, 2), cell(1.0, 7, 3), cell(1e-9 * cost_total(&l->flops), 9, 3);
    cell(rate(1e-9 * cost_total(&l->flops), l->wall), 9, 1), printf("\n");
    printf("  mixing + collapse: %.1f%% of the layer's time\n",
           100 * rate(l->stages.mixing + l->stages.collapse, l->wall));
    if (!l->backward_ran) return;
    const iha_stage_times *b = &l->backward_stages;
    printf("  backward (iha_backward: dx and every weight's gradient, forward recomputed): %.2f ms, %.2f x the "
           "forward\n    stages ms: projections %.2f, mixing %.2f, attention %.2f, collapse %.2f, output %.2f\n",
           1e3 * l->backward_wall, rate(l->backward_wall, l->wall), 1e3 * b->projections, 1e3 * b->mixing,
           1e3 * b->attention, 1e3 * b->collapse, 1e3 * b->output);
    printf("  saved pair (iha_forward_save, then iha_backward_saved: the attention forward not recomputed, "
           "%.1f MB saved):\n    forward_save %.2f ms (%.2f x iha_forward), backward_saved %.2f ms (%.2f x "
           "iha_backward); training step %.2f x forward + iha_backward\n",
           1e-6 * l->saved_bytes, 1e3 * l->forward_save_wall, rate(l->forward_save_wall, l->wall),
           1e3 * l->backward_saved_wall, rate(l->backward_saved_wall, l->backward_wall),
           rate(l->forward_save_wall + l->backward_saved_wall, l->wall + l->backward_wall));
}

static void print_cold(const bench_results *r)
{
    printf("\ncold start (child processes, fresh IHA cache dir and POCL_CACHE_DIR; layer shape above)\n");
    const bench_cold_start *c = &r->cold;
    if (c->state != BENCH_RAN) {
        printf("  %s\n", c->state == BENCH_SKIPPED ? "skipped (--no-cold-start)" : c->note);
        return;
    }
    printf("  %-22s %12s %14s %10s %12s\n", "program caches", "context ms", "1st forward ms", "sum ms", "process ms");
    const bench_cold_run *runs[2] = {&c->empty, &c->warm};
    static const char *const names[2] = {"empty", "warm (new process)"};
    for (int i = 0; i < 2; i++) {
        printf("  %-22s", names[i]);
        cell(1e3 * runs[i]->context_seconds, 12, 1), cell(1e3 * runs[i]->forward_seconds, 14, 1);
        cell(1e3 * (runs[i]->context_seconds + runs[i]->forward_seconds), 10, 1);
        cell(1e3 * runs[i]->process_seconds, 12, 1), printf("\n");
    }
}

static void print_decode(const bench_config *cfg, const bench_results *r)
{
    const iha_shape *s = &cfg->core;
    char mask[128];
    describe_mask(s, &cfg->options, mask, sizeof mask);
    printf("\ndecoding step: B=%zu H=%zu d=%zu P=%zu D=%zu, %zu cached tokens (%zu virtual) + 1, %s cache, %s weights, "
           "%s\n",
           s->batch, s->heads, s->head_dim, s->pseudo, cfg->layer.model_dim, cfg->decode_tokens,
           cfg->decode_tokens * s->pseudo, cfg->decode_half ? "half" : "float",
           cfg->half_weights ? "half" : "float", mask);
    const bench_decode *d = &r->decode;
    if (d->state != BENCH_RAN) {
        printf("  %s\n", d->note);
        return;
    }
    printf("  step            %9.3f ms  %9.1f tokens/s (B tokens per step)\n", 1e3 * d->step_seconds,
           rate((double)s->batch, d->step_seconds));
    printf("  attention       %9.3f ms  reads %.1f MB of cache: %.2f GB/s", 1e3 * d->attention_seconds,
           1e-6 * d->cache_bytes_read, rate(1e-9 * d->cache_bytes_read, d->attention_seconds));
    if (ceilings_ran(r))
        printf(", %.2f of the copy bandwidth", rate(d->cache_bytes_read, d->attention_seconds) /
                                                   r->ceilings.copy_bytes_per_second);
    printf("\n  cache           %.0f bytes per token\n", d->cache_bytes_per_token);
    print_choice(&d->choice);
}

void bench_print_table(const bench_config *c, const bench_results *r)
{
    printf("iha bench (library %s)\n", iha_version_string());
    printf("  device  %s%s\n", r->device, r->device_is_cpu ? " (CPU)" : "");
    printf("  timing  medians of %zu runs after one warm-up run\n", c->reps);
    if (r->load.known)
        printf("  load    host load average (1 min) %.2f at the start, %.2f at the end, %ld CPUs online\n",
               r->load.start, r->load.end, r->load.cpus);
    if (ceilings_ran(r))
        print_ceilings(r);
    else
        printf("\nceilings\n  skipped (--no-ceilings)\n");
    if (c->run_decode) {
        print_decode(c, r);
        printf("\nattention core, unfused baseline, layer, cold start: skipped (--decode)\n");
        return;
    }
    print_core(c, r);
    print_backward(r);
    print_layer(c, r);
    print_cold(r);
}

/* ---- JSON ---- */

static void json_gemm(json_writer *w, const bench_gemm *g)
{
    json_begin_object(w, NULL);
    json_size(w, "m", g->m);
    json_size(w, "n", g->n);
    json_size(w, "k", g->k);
    json_number(w, "seconds", g->seconds);
    json_number(w, "gflops", gemm_gflops(g));
    json_end_object(w);
}

static void json_shape(json_writer *w, const iha_shape *s, const iha_attention_options *o, int with_model_dim)
{
    json_size(w, "batch", s->batch);
    json_size(w, "heads", s->heads);
    json_size(w, "n", s->tokens);
    json_size(w, "p", s->pseudo);
    json_size(w, "t", s->tokens * s->pseudo);
    json_size(w, "d", s->head_dim);
    if (with_model_dim)
        json_size(w, "model_dim", s->model_dim);
    json_string(w, "mask", mask_names[o->mask]);
    json_number(w, "window", (double)o->window);
}

static void json_ceilings(json_writer *w, const bench_results *r)
{
    const bench_ceilings *c = &r->ceilings;
    json_begin_object(w, "ceilings");
    json_string(w, "state", state_name(c->state));
    if (c->state == BENCH_RAN) {
        json_size(w, "copy_bytes", c->copy_bytes);
        json_number(w, "copy_bytes_per_second", c->copy_bytes_per_second);
        json_begin_array(w, "clblast_gemm");
        json_gemm(w, &c->clblast_square);
        json_gemm(w, &c->clblast_projection);
        json_end_array(w);
        json_begin_array(w, "library_gemm");
        json_gemm(w, &c->kernel_projection);
        json_gemm(w, &c->kernel_row);
        json_end_array(w);
        json_number(w, "peak_fma_gflops", c->peak_fma_gflops);
        json_begin_object(w, "attention_loops");
        json_string(w, "state", state_name(c->loops_state));
        if (c->loops_state == BENCH_NOT_RUN)
            json_string(w, "note", c->loops_note);
        if (c->loops_state == BENCH_RAN) {
            json_number(w, "score_gflops", c->loops_score_gflops);
            json_number(w, "pv_gflops", c->loops_pv_gflops);
            json_number(w, "gflops", loops_gflops(c));
        }
        json_end_object(w);
        if (c->rechecked) {
            const double *pf = c->peak_fma_readings;
            json_begin_object(w, "readings");
            json_begin_array(w, "peak_fma_gflops");
            json_number(w, NULL, reading_rate(pf[0]));
            json_number(w, NULL, reading_rate(pf[1]));
            json_end_array(w);
            json_begin_array(w, "clblast_gemm_gflops");
            for (int i = 0; i < 2; i++)
                json_number(w, NULL, reading_gflops(&c->clblast_square, c->clblast_square_readings[i]));
            json_end_array(w);
            if (c->host_state == BENCH_RAN) {
                json_begin_array(w, "host_sgemm_gflops");
                for (int i = 0; i < 2; i++)
                    json_number(w, NULL, reading_gflops(&c->host_square, c->host_square_readings[i]));
                json_end_array(w);
            }
            json_end_object(w);
        }
        json_begin_object(w, "host_sgemm");
        json_string(w, "state", state_name(c->host_state));
        json_string(w, c->host_state == BENCH_RAN ? "library" : "note", c->host_note);
        if (c->host_state == BENCH_RAN) {
            json_begin_array(w, "gemm");
            json_gemm(w, &c->host_square);
            json_gemm(w, &c->host_projection);
            json_end_array(w);
        }
        json_end_object(w);
    }
    json_end_object(w);
}

static void json_core(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_core *c = &r->core;
    const bench_ceilings *k = &r->ceilings;
    const double g = rate(c->flops, c->seconds);
    json_begin_object(w, "attention");
    json_string(w, "state", state_name(c->state));
    if (c->state == BENCH_RAN) {
        json_shape(w, &cfg->core, &cfg->options, 0);
        json_number(w, "flops", c->flops);
        json_number(w, "bytes", c->bytes);
        json_number(w, "seconds", c->seconds);
        json_number(w, "gflops", 1e-9 * g);
        json_number(w, "bytes_per_second", rate(c->bytes, c->seconds));
        json_number(w, "fraction_of_peak_fma", fraction(g, k->peak_fma_gflops * 1e9, ceilings_ran(r)));
        json_number(w, "fraction_of_clblast_gemm",
                    fraction(g, gemm_gflops(&k->clblast_square) * 1e9, ceilings_ran(r)));
        json_number(w, "fraction_of_host_sgemm", fraction(g, gemm_gflops(&k->host_square) * 1e9, host_ran(r)));
        json_number(w, "fraction_of_attention_loops", fraction(g, loops_gflops(k) * 1e9, loops_ran(r)));
        json_number(w, "fraction_of_copy_bandwidth",
                    fraction(rate(c->bytes, c->seconds), k->copy_bytes_per_second, ceilings_ran(r)));
        json_choice(w, &c->choice);
    }
    json_end_object(w);

    const bench_baseline *b = &r->baseline;
    json_begin_object(w, "baseline");
    json_string(w, "state", state_name(b->state));
    if (b->state == BENCH_NOT_RUN)
        json_string(w, "note", b->note);
    if (b->state == BENCH_RAN) {
        json_size(w, "reps", cfg->baseline_reps);
        json_number(w, "sequence_seconds", b->sequence_seconds);
        json_size(w, "sequences_compared", b->sequences_timed);
        json_number(w, "seconds", b->seconds);
        json_number(w, "gflops", rate(1e-9 * c->flops, b->seconds));
        json_number(w, "speedup", rate(b->seconds, c->seconds));
        json_number(w, "rel_difference", b->rel_difference);
    }
    json_end_object(w);
}

static void json_backward(json_writer *w, const bench_results *r)
{
    const bench_backward *b = &r->backward;
    const double g = rate(b->flops, b->seconds);
    json_begin_object(w, "backward");
    json_string(w, "state", state_name(b->state));
    if (b->state == BENCH_RAN) {
        json_number(w, "flops", b->flops);
        json_number(w, "seconds", b->seconds);
        json_number(w, "gflops", 1e-9 * g);
        json_number(w, "forward_seconds", b->forward_seconds);
        json_number(w, "backward_over_forward", rate(b->seconds, b->forward_seconds));
        json_number(w, "fraction_of_peak_fma", fraction(g, r->ceilings.peak_fma_gflops * 1e9, ceilings_ran(r)));
    }
    json_end_object(w);
}

static void json_layer(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_layer *l = &r->layer;
    json_begin_object(w, "layer");
    json_string(w, "state", state_name(l->state));
    if (l->state == BENCH_RAN) {
        json_shape(w, &cfg->layer, &cfg->options, 1);
        json_bool(w, "half_weights", cfg->half_weights);
        json_number(w, "seconds", l->wall);
        json_number(w, "flops", cost_total(&l->flops));
        json_number(w, "gflops", rate(1e-9 * cost_total(&l->flops), l->wall));
        json_number(w, "mixing_collapse_share", rate(l->stages.mixing + l->stages.collapse, l->wall));
        stage_row rows[5];
        layer_rows(r, rows);
        json_begin_object(w, "stages");
        for (int i = 0; i < 5; i++) {
            json_begin_object(w, rows[i].name);
            json_number(w, "seconds", rows[i].seconds);
            json_number(w, "share", rate(rows[i].seconds, l->wall));
            json_number(w, "flops", rows[i].flops);
            json_number(w, "gflops", rate(1e-9 * rows[i].flops, rows[i].seconds));
            if (rows[i].bytes > 0) {
                json_number(w, "bytes", rows[i].bytes);
                json_number(w, "bytes_per_second", rate(rows[i].bytes, rows[i].seconds));
            }
            char key[64];
            snprintf(key, sizeof key, "fraction_of_%s", rows[i].ceiling_name);
            json_number(w, key, rows[i].ceiling);
            json_end_object(w);
        }
        json_end_object(w);
        if (l->backward_ran) {
            const iha_stage_times *b = &l->backward_stages;
            json_begin_object(w, "backward");
            json_number(w, "seconds", l->backward_wall);
            json_number(w, "backward_over_forward", rate(l->backward_wall, l->wall));
            json_begin_object(w, "stage_seconds");
            const double st[5] = {b->projections, b->mixing, b->attention, b->collapse, b->output};
            static const char *const names[5] = {"projections", "mixing", "attention", "collapse", "output"};
            for (int i = 0; i < 5; i++) json_number(w, names[i], st[i]);
            json_end_object(w);
            json_begin_object(w, "saved_pair");
            json_number(w, "forward_save_seconds", l->forward_save_wall);
            json_number(w, "backward_saved_seconds", l->backward_saved_wall);
            json_number(w, "saved_bytes", l->saved_bytes);
            json_number(w, "step_over_recomputing_step",
                        rate(l->forward_save_wall + l->backward_saved_wall, l->wall + l->backward_wall));
            json_end_object(w);
            json_end_object(w);
        }
    }
    json_end_object(w);
}

static void json_cold_run(json_writer *w, const char *key, const bench_cold_run *c)
{
    json_begin_object(w, key);
    json_number(w, "context_seconds", c->context_seconds);
    json_number(w, "first_forward_seconds", c->forward_seconds);
    json_number(w, "process_seconds", c->process_seconds);
    json_end_object(w);
}

/* The decoding step's own shape: the core's B, H, d, P, mask and window with the layer's D; its
 * sequence length is cached_tokens (+ 1 new token), not the core's N. */
static void json_decode(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_decode *d = &r->decode;
    const iha_shape *s = &cfg->core;
    json_begin_object(w, "decode");
    json_string(w, "state", state_name(d->state));
    if (d->state != BENCH_SKIPPED) {
        json_size(w, "batch", s->batch);
        json_size(w, "heads", s->heads);
        json_size(w, "p", s->pseudo);
        json_size(w, "d", s->head_dim);
        json_size(w, "model_dim", cfg->layer.model_dim);
        json_string(w, "mask", mask_names[cfg->options.mask]);
        json_number(w, "window", (double)cfg->options.window);
        json_size(w, "cached_tokens", cfg->decode_tokens);
        json_bool(w, "half", cfg->decode_half);
        json_bool(w, "half_weights", cfg->half_weights);
    }
    if (d->state == BENCH_RAN) {
        const double bandwidth = rate(d->cache_bytes_read, d->attention_seconds);
        json_number(w, "step_seconds", d->step_seconds);
        json_number(w, "tokens_per_second", rate((double)s->batch, d->step_seconds));
        json_number(w, "attention_seconds", d->attention_seconds);
        json_number(w, "cache_bytes_read", d->cache_bytes_read);
        json_number(w, "cache_bytes_per_second", bandwidth);
        json_number(w, "fraction_of_copy_bandwidth",
                    fraction(bandwidth, r->ceilings.copy_bytes_per_second, ceilings_ran(r)));
        json_number(w, "cache_bytes_per_token", d->cache_bytes_per_token);
        json_choice(w, &d->choice);
    } else if (d->state == BENCH_NOT_RUN) {
        json_string(w, "note", d->note);
    }
    json_end_object(w);
}

void bench_print_json(const bench_config *c, const bench_results *r)
{
    json_writer w;
    json_init(&w, stdout);
    json_begin_object(&w, NULL);
    json_string(&w, "iha_version", iha_version_string());
    json_string(&w, "device", r->device);
    json_bool(&w, "device_is_cpu", r->device_is_cpu);
    json_size(&w, "reps", c->reps);
    if (r->load.known) {
        json_begin_object(&w, "host_load");
        json_number(&w, "start", r->load.start);
        json_number(&w, "end", r->load.end);
        json_size(&w, "cpus", (size_t)(r->load.cpus > 0 ? r->load.cpus : 0));
        json_end_object(&w);
    } else {
        json_null(&w, "host_load");
    }
    /* The attention core's figures, the ones most readers want; null when it did not run. */
    const int core_ran = r->core.state == BENCH_RAN;
    json_number(&w, "seconds", core_ran ? r->core.seconds : NAN);
    json_number(&w, "gflops", core_ran ? rate(1e-9 * r->core.flops, r->core.seconds) : NAN);
    json_core(&w, c, r);
    json_backward(&w, r);
    json_layer(&w, c, r);
    json_decode(&w, c, r);
    json_ceilings(&w, r);
    json_begin_object(&w, "cold_start");
    json_string(&w, "state", state_name(r->cold.state));
    if (r->cold.state == BENCH_NOT_RUN)
        json_string(&w, "note", r->cold.note);
    if (r->cold.state == BENCH_RAN) {
        json_cold_run(&w, "empty_cache", &r->cold.empty);
        json_cold_run(&w, "warm_cache", &r->cold.warm);
    }
    json_end_object(&w);
    json_end_object(&w);
}
