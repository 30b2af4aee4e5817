/*
 * cmd_check.c - "iha check": the self-test to run first on a device nobody has tried. It runs
 * iha_check, which checks every kernel family and configuration the device's layer calls would
 * use against float64, and prints a row per kernel and configuration as each completes.
 */
#include <stdio.h>
#include <string.h>

#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"
#include "iha_tune.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    {"family", "NAME", "only one family: attention, rows, decode, decode_compact, gemm, backward, half or bf16 (default all)", NULL},
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "check",
    "[--device SPEC] [--family NAME]",
    "Checks, on the device, every kernel family and variant its layer calls would use: the\n"
    "built-in configurations and those of the device's tuning profile, on small ragged shapes\n"
    "under every mask (causal, token_causal, none), global and with a window, against a float64\n"
    "reference. One row per kernel and configuration: family, where the configuration comes\n"
    "from (built-in or profile), result, the largest relative error and its limit, the problem,\n"
    "and the configuration. 'unsupported' is a call the library refuses on this device (it never\n"
    "returns a wrong result there). About a minute on a 2-core CPU. Run it before trusting a new\n"
    "device or driver. Exit status: 0 every row ok or unsupported, 1 a row FAILED or the check\n"
    "could not run, 2 usage.",
    options,
};

static const char *const family_names[] = {"attention", "rows", "decode", "gemm", "backward", "half", "bf16",
                                           "decode_compact", NULL};
static const unsigned family_bits[] = {IHA_CHECK_ATTENTION, IHA_CHECK_ROWS, IHA_CHECK_DECODE,
                                       IHA_CHECK_GEMM,      IHA_CHECK_BACKWARD, IHA_CHECK_HALF,
                                       IHA_CHECK_BF16,      IHA_CHECK_DECODE_COMPACT};

static const char *source_words(int source)
{
    switch (source) {
    case IHA_CONFIG_PROFILE_EXACT: return "profile";
    case IHA_CONFIG_PROFILE_NEAREST: return "profile:near"; /* the nearest bucket's entry */
    case IHA_CONFIG_PROFILE_DEVICE: return "profile:dev";   /* the device-wide default */
    case IHA_CONFIG_BUILTIN_SAFE: return "built-in:safe";
    default: return "built-in";
    }
}

static const char *state_words(int state)
{
    return state == IHA_CHECK_OK ? "ok" : state == IHA_CHECK_UNSUPPORTED ? "unsupported" : "FAILED";
}

static void print_row(const iha_check_row *row, void *user)
{
    (void)user;
    printf("%-18s %-13s %-11s %9.2e %8.1e  %s  [%s]\n", row->family, source_words(row->source),
           state_words(row->state), row->error, row->limit, row->shape, row->config);
    if (row->state != IHA_CHECK_OK) printf("    %s\n", row->note);
    fflush(stdout);
}

int cmd_check(int argc, char **argv)
{
    int rc = cli_parse(&spec, argc, argv);
    if (rc >= 0) return rc;
    int family = -1;
    if (cli_get_choice(&spec, "family", family_names, &family) != 0) return CLI_EXIT_USAGE;

    iha_context *ctx;
    if (cli_open_context(&spec, NULL, &ctx)) return CLI_EXIT_FAILURE;
    iha_profile_info profile;
    const char *profile_text = "none";
    if (iha_context_profile(ctx, &profile) != IHA_OK || profile.state == IHA_PROFILE_IGNORED)
        profile_text = "ignored (built-ins only)";
    else if (profile.state == IHA_PROFILE_LOADED)
        profile_text = "loaded";
    else if (profile.state == IHA_PROFILE_OFF)
        profile_text = "off";
    printf("iha check (library %s) on %s; profile: %s%s%s\n", iha_version_string(), iha_context_device_name(ctx),
           profile_text, profile.path[0] ? " " : "", profile.path);
    printf("%-18s %-13s %-11s %9s %8s  %s  [%s]\n", "family", "source", "result", "error", "limit", "problem",
           "configuration");

    iha_check_options opts;
    iha_check_options_init(&opts);
    if (family >= 0) opts.families = family_bits[family];
    opts.row = print_row;
    iha_check_summary summary;
    const iha_status st = iha_check(ctx, &opts, NULL, 0, &summary);
    if (st != IHA_OK) {
        cli_error(&spec, "iha_check: %s: %s", iha_status_name(st), iha_context_message(ctx));
        iha_context_free(ctx);
        return CLI_EXIT_FAILURE;
    }
    printf("%zu rows in %.1f s: %zu ok, %zu FAILED, %zu unsupported\n", summary.rows, summary.seconds,
           summary.rows - summary.failed - summary.unsupported, summary.failed, summary.unsupported);
    iha_context_free(ctx);
    return summary.failed ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
