/* bench_report_json.c - "iha bench" results as one JSON object: every section is present
 * with a "state"; a section that did not run has nothing else but a note saying why. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "bench/bench_report.h"
#include "common/json.h"
#include "common/mask_names.h"

/* config, config_source and config_source_bucket ("" unless the source is a profile bucket);
 * null when the call reported no configuration. */
/* Opens the object `name` with the state of what it reports, and the note saying why when that
 * did not run (note may be NULL); returns whether it ran. */
static int json_section(json_writer *w, const char *name, bench_state state, const char *note)
{
    json_begin_object(w, name);
    json_string(w, "state", report_state_name(state));
    if (state == BENCH_NOT_RUN && note)
        json_string(w, "note", note);
    return state == BENCH_RAN;
}

static void json_choice(json_writer *w, const bench_choice *c)
{
    if (!c->found) {
        json_null(w, "config");
        json_null(w, "config_source");
        json_null(w, "config_source_bucket");
        return;
    }
    json_string(w, "config", c->config);
    json_string(w, "config_source", report_source_name(c->source));
    json_string(w, "config_source_bucket", c->source_bucket);
}

/* ---- JSON ---- */

static void json_gemm(json_writer *w, const bench_gemm *g)
{
    json_begin_object(w, NULL);
    json_size(w, "m", g->m);
    json_size(w, "n", g->n);
    json_size(w, "k", g->k);
    json_number(w, "seconds", g->seconds);
    json_number(w, "gflops", report_gemm_gflops(g));
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
    if (json_section(w, "ceilings", c->state, NULL)) {
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
        if (json_section(w, "attention_loops", c->loops_state, c->loops_note)) {
            json_number(w, "score_gflops", c->loops_score_gflops);
            json_number(w, "pv_gflops", c->loops_pv_gflops);
            json_number(w, "gflops", report_loops_gflops(c));
        }
        json_end_object(w);
        if (c->rechecked) {
            const double *pf = c->peak_fma_readings;
            json_begin_object(w, "readings");
            json_begin_array(w, "peak_fma_gflops");
            json_number(w, NULL, report_reading_rate(pf[0]));
            json_number(w, NULL, report_reading_rate(pf[1]));
            json_end_array(w);
            json_begin_array(w, "clblast_gemm_gflops");
            for (int i = 0; i < 2; i++)
                json_number(w, NULL, report_reading_gflops(&c->clblast_square, c->clblast_square_readings[i]));
            json_end_array(w);
            if (c->host_state == BENCH_RAN) {
                json_begin_array(w, "host_sgemm_gflops");
                for (int i = 0; i < 2; i++)
                    json_number(w, NULL, report_reading_gflops(&c->host_square, c->host_square_readings[i]));
                json_end_array(w);
            }
            json_end_object(w);
        }
        json_begin_object(w, "host_sgemm");
        json_string(w, "state", report_state_name(c->host_state));
        json_string(w, c->host_state == BENCH_RAN ? "library" : "note", c->host_note);
        if (c->host_state == BENCH_RAN && c->host_core[0])
            json_string(w, "core", c->host_core);
        if (c->host_state == BENCH_RAN && c->host_warning[0])
            json_string(w, "warning", c->host_warning);
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
    const double g = report_rate(c->flops, c->seconds);
    if (json_section(w, "attention", c->state, NULL)) {
        json_shape(w, &cfg->core, &cfg->options, 0);
        json_bool(w, "core_half", cfg->core_half);
        json_number(w, "flops", c->flops);
        json_number(w, "bytes", c->bytes);
        json_number(w, "seconds", c->seconds);
        json_number(w, "gflops", 1e-9 * g);
        json_number(w, "bytes_per_second", report_rate(c->bytes, c->seconds));
        json_number(w, "fraction_of_peak_fma", report_fraction(g, k->peak_fma_gflops * 1e9, report_ceilings_ran(r)));
        json_number(w, "fraction_of_clblast_gemm",
                    report_fraction(g, report_gemm_gflops(&k->clblast_square) * 1e9, report_ceilings_ran(r)));
        json_number(w, "fraction_of_host_sgemm", report_fraction(g, report_gemm_gflops(&k->host_square) * 1e9, report_host_ran(r)));
        json_number(w, "fraction_of_attention_loops", report_fraction(g, report_loops_gflops(k) * 1e9, report_loops_ran(r)));
        json_number(w, "fraction_of_copy_bandwidth",
                    report_fraction(report_rate(c->bytes, c->seconds), k->copy_bytes_per_second, report_ceilings_ran(r)));
        json_choice(w, &c->choice);
    }
    json_end_object(w);

    const bench_baseline *b = &r->baseline;
    if (json_section(w, "baseline", b->state, b->note)) {
        json_size(w, "reps", cfg->baseline_reps);
        json_number(w, "sequence_seconds", b->sequence_seconds);
        json_size(w, "sequences_compared", b->sequences_timed);
        json_number(w, "seconds", b->seconds);
        json_number(w, "gflops", report_rate(1e-9 * c->flops, b->seconds));
        json_number(w, "speedup", report_rate(b->seconds, c->seconds));
        json_number(w, "rel_difference", b->rel_difference);
    }
    json_end_object(w);
}

static void json_backward(json_writer *w, const bench_results *r)
{
    const bench_backward *b = &r->backward;
    const double g = report_rate(b->flops, b->seconds);
    if (json_section(w, "backward", b->state, NULL)) {
        json_number(w, "flops", b->flops);
        json_number(w, "seconds", b->seconds);
        json_number(w, "gflops", 1e-9 * g);
        json_number(w, "forward_seconds", b->forward_seconds);
        json_number(w, "backward_over_forward", report_rate(b->seconds, b->forward_seconds));
        json_number(w, "fraction_of_peak_fma", report_fraction(g, r->ceilings.peak_fma_gflops * 1e9, report_ceilings_ran(r)));
    }
    json_end_object(w);
}

static void json_layer(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_layer *l = &r->layer;
    if (json_section(w, "layer", l->state, NULL)) {
        json_shape(w, &cfg->layer, &cfg->options, 1);
        json_bool(w, "half_weights", cfg->half_weights);
        json_bool(w, "bf16", cfg->bf16);
        json_number(w, "seconds", l->wall);
        json_number(w, "flops", cost_total(&l->flops));
        json_number(w, "gflops", report_rate(1e-9 * cost_total(&l->flops), l->wall));
        json_number(w, "mixing_collapse_share", report_rate(l->stages.mixing + l->stages.collapse, l->wall));
        stage_row rows[5];
        report_layer_rows(r, rows);
        json_begin_object(w, "stages");
        for (int i = 0; i < 5; i++) {
            json_begin_object(w, rows[i].name);
            json_number(w, "seconds", rows[i].seconds);
            json_number(w, "share", report_rate(rows[i].seconds, l->wall));
            json_number(w, "flops", rows[i].flops);
            json_number(w, "gflops", report_rate(1e-9 * rows[i].flops, rows[i].seconds));
            if (rows[i].bytes > 0) {
                json_number(w, "bytes", rows[i].bytes);
                json_number(w, "bytes_per_second", report_rate(rows[i].bytes, rows[i].seconds));
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
            json_number(w, "backward_over_forward", report_rate(l->backward_wall, l->wall));
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
                        report_rate(l->forward_save_wall + l->backward_saved_wall, l->wall + l->backward_wall));
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
    json_number(w, "second_forward_seconds", c->second_forward_seconds);
    json_number(w, "process_seconds", c->process_seconds);
    json_end_object(w);
}

/* --ring: null without it; else its L and, per position, both caches' step time and bytes. */
static void json_ring(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_ring *g = &r->ring;
    if (cfg->ring_tokens == 0) {
        json_null(w, "ring");
        return;
    }
    json_begin_object(w, "ring");
    json_string(w, "state", report_state_name(g->state));
    json_size(w, "cache_tokens", cfg->ring_tokens);
    if (g->state == BENCH_RAN) {
        json_begin_array(w, "positions");
        for (size_t i = 0; i < BENCH_RING_POSITIONS; ++i) {
            const bench_ring_position *at = &g->at[i];
            json_begin_object(w, NULL);
            json_size(w, "cached_tokens", at->tokens);
            json_number(w, "ring_step_seconds", at->ring_step_seconds);
            json_size(w, "ring_cache_bytes", at->ring_cache_bytes);
            json_number(w, "full_step_seconds", at->full_step_seconds);
            json_size(w, "full_cache_bytes", at->full_cache_bytes);
            json_end_object(w);
        }
        json_end_array(w);
    } else if (g->state == BENCH_NOT_RUN) {
        json_string(w, "note", g->note);
    }
    json_end_object(w);
}

/* One cache layout's measured step. */
static void json_decode_cache(json_writer *w, const iha_shape *s, const bench_results *r, const bench_decode *d)
{
    if (d->state == BENCH_RAN) {
        const double bandwidth = report_rate(d->cache_bytes_read, d->attention_seconds);
        json_number(w, "step_seconds", d->step_seconds);
        json_number(w, "tokens_per_second", report_rate((double)s->batch, d->step_seconds));
        json_number(w, "attention_seconds", d->attention_seconds);
        json_number(w, "cache_bytes_read", d->cache_bytes_read);
        json_number(w, "cache_bytes_per_second", bandwidth);
        json_number(w, "fraction_of_copy_bandwidth",
                    report_fraction(bandwidth, r->ceilings.copy_bytes_per_second, report_ceilings_ran(r)));
        json_number(w, "cache_bytes_per_token", d->cache_bytes_per_token);
        json_choice(w, &d->choice);
    } else if (d->state == BENCH_NOT_RUN) {
        json_string(w, "note", d->note);
    }
}

/* The decoding step's own shape: the core's B, H, d, P, mask and window with the layer's D; its
 * sequence length is cached_tokens (+ 1 new token), not the core's N. */
static void json_decode(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_decode *d = &r->decode;
    const iha_shape *s = &cfg->core;
    json_begin_object(w, "decode");
    json_string(w, "state", report_state_name(d->state));
    if (d->state != BENCH_SKIPPED) {
        json_size(w, "batch", s->batch);
        json_size(w, "heads", s->heads);
        json_size(w, "p", s->pseudo);
        json_size(w, "d", s->head_dim);
        json_size(w, "model_dim", cfg->layer.model_dim);
        json_string(w, "mask", mask_names[cfg->options.mask]);
        json_number(w, "window", (double)cfg->options.window);
        json_number(w, "rope_base", cfg->options.rope ? (cfg->options.rope_base > 0.0f ? cfg->options.rope_base : 10000.0)
                                                      : 0.0);
        json_size(w, "cached_tokens", cfg->decode_tokens);
        json_bool(w, "half", cfg->decode_half);
        json_bool(w, "half_weights", cfg->half_weights);
        json_bool(w, "bf16", cfg->bf16);
    }
    json_decode_cache(w, s, r, d);
    if (cfg->decode_compact) {
        json_begin_object(w, "compact");
        json_string(w, "state", report_state_name(r->decode_compact.state));
        json_decode_cache(w, s, r, &r->decode_compact);
        json_end_object(w);
    }
    if (d->state != BENCH_SKIPPED) json_ring(w, cfg, r);
    json_end_object(w);
}

/* --seq-lens: the packed row, its sequences one by one, and one unpacked row. */
static void json_packed(json_writer *w, const bench_config *cfg, const bench_results *r)
{
    const bench_packed *p = &r->packed;
    const iha_shape *s = &cfg->core;
    json_begin_object(w, "packed");
    json_string(w, "state", report_state_name(p->state));
    if (p->state == BENCH_RAN) {
        const double d4 = 4.0 * (double)s->head_dim * 1e-9;
        json_begin_array(w, "seq_lens");
        for (size_t i = 0; i < cfg->seq_count; i++) json_size(w, NULL, cfg->seq_lens[i]);
        json_end_array(w);
        json_size(w, "n", s->tokens);
        json_size(w, "heads", s->heads);
        json_size(w, "p", s->pseudo);
        json_size(w, "d", s->head_dim);
        json_string(w, "mask", mask_names[cfg->options.mask]);
        json_number(w, "window", (double)cfg->options.window);
        json_number(w, "visible_pairs", p->visible_pairs);
        json_number(w, "packed_seconds", p->packed_seconds);
        json_number(w, "packed_gflops", report_rate(d4 * p->visible_pairs, p->packed_seconds));
        json_number(w, "separate_seconds", p->separate_seconds);
        json_number(w, "separate_gflops", report_rate(d4 * p->visible_pairs, p->separate_seconds));
        json_number(w, "packed_over_separate", p->separate_seconds > 0 ? p->packed_seconds / p->separate_seconds : NAN);
        json_number(w, "unpacked_visible_pairs", p->unpacked_pairs);
        json_number(w, "unpacked_seconds", p->unpacked_seconds);
        json_choice(w, &p->choice);
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
    json_number(&w, "gflops", core_ran ? report_rate(1e-9 * r->core.flops, r->core.seconds) : NAN);
    json_core(&w, c, r);
    json_backward(&w, r);
    json_layer(&w, c, r);
    json_decode(&w, c, r);
    json_packed(&w, c, r);
    json_ceilings(&w, r);
    if (json_section(&w, "cold_start", r->cold.state, r->cold.note)) {
        json_cold_run(&w, "empty_cache", &r->cold.empty);
        json_cold_run(&w, "warm_cache", &r->cold.warm);
    }
    json_end_object(&w);
    json_end_object(&w);
}
