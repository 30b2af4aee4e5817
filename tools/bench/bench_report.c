/*
 * bench_report.c - what "iha bench"'s table (bench_report_table.c) and JSON object
 * (bench_report_json.c, keys in doc/benchmarking.md) share. A ratio to a ceiling
 * that was not measured, or a reading that failed, is NaN here, "-" in the table and null in
 * JSON.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "bench/bench_report.h"
#include "common/json.h"
#include "common/mask_names.h"

double report_rate(double amount, double seconds) { return seconds > 0 ? amount / seconds : NAN; }

double report_gemm_gflops(const bench_gemm *g)
{
    return report_rate(2e-9 * (double)g->m * (double)g->n * (double)g->k, g->seconds);
}

int report_ceilings_ran(const bench_results *r) { return r->ceilings.state == BENCH_RAN; }
int report_loops_ran(const bench_results *r) { return report_ceilings_ran(r) && r->ceilings.loops_state == BENCH_RAN; }
/* The two loops run one after the other on every key block: their combined rate. */
double report_loops_gflops(const bench_ceilings *c)
{
    return 2.0 / (1.0 / c->loops_score_gflops + 1.0 / c->loops_pv_gflops);
}
int report_host_ran(const bench_results *r) { return report_ceilings_ran(r) && r->ceilings.host_state == BENCH_RAN; }

/* a / b when the ceiling b was measured, else NaN. */
double report_fraction(double a, double b, int measured) { return measured && b > 0 ? a / b : NAN; }

const char *report_state_name(bench_state s)
{
    return s == BENCH_RAN ? "ran" : s == BENCH_SKIPPED ? "skipped" : "not_run";
}

/* iha_config_source values, as JSON names and as words for the table. */
const char *report_source_name(int source)
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

const char *report_source_words(int source)
{
    switch (source) {
    case IHA_CONFIG_PROFILE_EXACT: return "the tuning profile's entry for this bucket";
    case IHA_CONFIG_PROFILE_NEAREST: return "the tuning profile's nearest bucket";
    case IHA_CONFIG_PROFILE_DEVICE: return "the tuning profile's device-wide default";
    case IHA_CONFIG_BUILTIN_TYPE: return "the built-in default for this device type (no usable profile entry)";
    default: return "the SAFE FALLBACK";
    }
}



void report_describe_mask(const iha_shape *s, const iha_attention_options *o, char *buf, size_t size)
{
    char rope[48] = "";
    if (o->rope) snprintf(rope, sizeof rope, ", rotary base %g", o->rope_base > 0.0f ? (double)o->rope_base : 10000.0);
    if (o->window > 0)
        snprintf(buf, size, "mask %s, window %" PRId64 " tokens (%" PRId64 " virtual keys)%s", mask_names[o->mask],
                 o->window, o->window * (int64_t)s->pseudo, rope);
    else
        snprintf(buf, size, "mask %s, global%s", mask_names[o->mask], rope);
}


void report_layer_rows(const bench_results *r, stage_row rows[5])
{
    const bench_layer *l = &r->layer;
    const bench_ceilings *c = &r->ceilings;
    const int ran = report_ceilings_ran(r);
    /* The projections against the GEMM rate of the backend the layer ran on. */
    const bench_gemm *gemm = l->library_gemm ? &c->kernel_projection : &c->clblast_projection;
    const char *gemm_name = l->library_gemm ? "library_gemm_projection" : "clblast_gemm_projection";
    const double proj = report_gemm_gflops(gemm) * 1e9, bw = c->copy_bytes_per_second;
    rows[0] = (stage_row){"projections", l->stages.projections, l->flops.projections, 0, 0, gemm_name};
    rows[1] = (stage_row){"mixing", l->stages.mixing, l->flops.mixing, l->mixing_bytes, 0, "copy_bandwidth"};
    rows[2] = (stage_row){"attention", l->stages.attention, l->flops.attention, 0, 0, "peak_fma"};
    rows[3] = (stage_row){"collapse", l->stages.collapse, l->flops.collapse, l->collapse_bytes, 0, "copy_bandwidth"};
    rows[4] = (stage_row){"output", l->stages.output, l->flops.output, 0, 0, gemm_name};
    rows[0].ceiling = report_fraction(report_rate(rows[0].flops, rows[0].seconds), proj, ran);
    rows[1].ceiling = report_fraction(report_rate(rows[1].bytes, rows[1].seconds), bw, ran);
    rows[2].ceiling = report_fraction(report_rate(rows[2].flops, rows[2].seconds), c->peak_fma_gflops * 1e9, ran);
    rows[3].ceiling = report_fraction(report_rate(rows[3].bytes, rows[3].seconds), bw, ran);
    rows[4].ceiling = report_fraction(report_rate(rows[4].flops, rows[4].seconds), proj, ran);
}

/* GFLOP/s of a reading of g's shape that took `seconds`; NAN for a reading not taken or failed. */
double report_reading_gflops(const bench_gemm *g, double seconds)
{
    bench_gemm one = *g;
    one.seconds = seconds;
    return seconds > 0 ? report_gemm_gflops(&one) : NAN;
}

/* A peak-FMA reading: 0 in bench_ceilings when it failed, NAN here like the GEMM readings. */
double report_reading_rate(double gflops) { return gflops > 0 ? gflops : NAN; }
