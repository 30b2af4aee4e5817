/*
 * layer_options.h - what the commands that run the library share on top of the parser: the
 * device option and the context it opens, and one table of the options that describe a layer's
 * shape and its attention, read with the same ranges by every command that takes them.
 */
#ifndef IHA_TOOLS_LAYER_OPTIONS_H
#define IHA_TOOLS_LAYER_OPTIONS_H

#include <stddef.h>

#include "common/args.h"
#include "iha.h"

/* iha.h's limit on iha_shape.head_dim: a larger --d is a range error of the command line. */
#define CLI_MAX_HEAD_DIM 256

/* The shared rows, for a command's option table. An option that means the same in every command
 * takes the command's default in words (a string literal); one whose meaning depends on the
 * command (what its tokens are, which masks it accepts) takes the command's whole help line.
 * The name and the value's name are the same everywhere, and so is the range cli_get_shape and
 * cli_get_attention accept. */
#define CLI_OPTION_DEVICE {"device", "SPEC", "P:D index or name substring (default $IHA_DEVICE, else first GPU)", NULL}
#define CLI_OPTION_BATCH(dflt) {"batch", "B", "sequences (default " dflt ")", NULL}
#define CLI_OPTION_HEADS(dflt) {"heads", "H", "heads (default " dflt ")", NULL}
#define CLI_OPTION_HEAD_DIM(dflt) {"d", "HEAD_DIM", "head width, 1..256 (default " dflt ")", NULL}
#define CLI_OPTION_PSEUDO(dflt) {"p", "P", "pseudo-heads per head (default " dflt ")", NULL}
#define CLI_OPTION_SEED {"seed", "S", "random seed of the layer (default 1)", NULL}
#define CLI_OPTION_TOKENS(help) {"n", "N", help, NULL}
#define CLI_OPTION_MODEL_DIM(help) {"model-dim", "D", help, NULL}
#define CLI_OPTION_MASK(help) {"mask", "MASK", help, NULL}
#define CLI_OPTION_WINDOW(help) {"window", "W", help, NULL}
#define CLI_OPTION_ROPE_BASE(help) {"rope-base", "BASE", help, NULL}

/* Reads --batch, --n (1 to max_tokens), --model-dim, --heads, --d and --p, those that the
 * command's table holds, into *shape, which holds the command's defaults. The caps keep every
 * product below overflow; cli_check_layer then applies the library's own limits. Returns 0, or
 * -1 after printing a usage message. */
int cli_get_shape(const cli_spec *spec, size_t max_tokens, iha_shape *shape);

/* Reads --mask, --window (min_window to max_window tokens) and --rope-base (which turns rotary
 * embedding on), those that the command's table holds, into *options, which holds the command's
 * defaults. Returns 0, or -1 after printing a usage message. */
int cli_get_attention(const cli_spec *spec, size_t min_window, size_t max_window, iha_attention_options *options);

/* The limits that iha.h states for every device (head_dim at most CLI_MAX_HEAD_DIM, T =
 * tokens * pseudo at most INT_MAX/4, heads * pseudo and batch * heads at most INT_MAX, tokens *
 * model_dim at most 8 * INT_MAX, and with options, an even head_dim for rotary embedding), so
 * that a command line no device could run is a usage error rather than a failed run. options
 * may be NULL; `what` names the shape in the message ("the layer"). Returns 0, or -1 after
 * printing a usage message. */
int cli_check_layer(const cli_spec *spec, const iha_shape *shape, const iha_attention_options *options,
                    const char *what);

/* Creates *ctx with `options` (NULL: the defaults) on the device that --device names (absent:
 * the library's choice); the option must be in the table. Returns 0, or -1 after printing the
 * status and the library's message (the caller fails). */
int cli_open_context(const cli_spec *spec, const iha_context_options *options, iha_context **ctx);

/* cli_open_context with the defaults and stage timing on, for the commands that report the time
 * of each stage. */
int cli_open_timed_context(const cli_spec *spec, iha_context **ctx);

#endif
