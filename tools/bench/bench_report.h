/* What the two outputs of "iha bench" (bench_report_table.c, bench_report_json.c) share:
 * derived rates and ratios, names of states and configuration sources, the layer's stages. */
#ifndef IHA_TOOLS_BENCH_REPORT_H
#define IHA_TOOLS_BENCH_REPORT_H
#include <stddef.h>

#include "bench/bench.h"

/* Derived figures of the attention core and each layer stage, shared by both outputs. */
typedef struct stage_row {
    const char *name;
    double seconds, flops, bytes; /* bytes 0: not a memory-bound stage */
    double ceiling;               /* fraction of its ceiling: see ceiling_name */
    const char *ceiling_name;
} stage_row;

double report_rate(double amount, double seconds);
double report_gemm_gflops(const bench_gemm *g);
int report_ceilings_ran(const bench_results *r);
int report_loops_ran(const bench_results *r);
double report_loops_gflops(const bench_ceilings *c);
int report_host_ran(const bench_results *r);
double report_fraction(double a, double b, int measured);
const char *report_state_name(bench_state s);
const char *report_source_name(int source);
const char *report_source_words(int source);
void report_describe_mask(const iha_shape *s, const iha_attention_options *o, char *buf, size_t size);
void report_layer_rows(const bench_results *r, stage_row rows[5]);
double report_reading_gflops(const bench_gemm *g, double seconds);
double report_reading_rate(double gflops);
#endif
