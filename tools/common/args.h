/*
 * args.h - the long-option parser shared by the subcommands: "--name value" or "--name=value",
 * each option at most once, "--help" everywhere, and value conversions that reject
 * non-numeric, negative and out-of-range text with a message naming the option.
 */
#ifndef IHA_TOOLS_ARGS_H
#define IHA_TOOLS_ARGS_H

#include <stddef.h>

typedef struct cli_option {
    const char *name;       /* without the leading "--"; NULL ends a table */
    const char *value_name; /* "DIR", "N", ...; NULL for a flag that takes no value */
    const char *help;       /* one line, default included */
    const char *value;      /* set by cli_parse: the text given, "" for a flag, NULL when absent */
} cli_option;

typedef struct cli_spec {
    const char *command;     /* "forward" */
    const char *synopsis;    /* what follows "iha forward" in the usage line */
    const char *description; /* a paragraph shown by --help */
    cli_option *options;     /* table ended by an entry with name NULL */
} cli_spec;

/* The program's name in messages and usage lines: "iha" unless the program sets it. */
extern const char *cli_program;

/* Parses argv[1..argc-1] into spec->options. Returns -1 when the command should go on;
 * otherwise the exit code to return at once: CLI_EXIT_OK after printing --help to stdout,
 * CLI_EXIT_USAGE after printing what is wrong to stderr. */
int cli_parse(cli_spec *spec, int argc, char **argv);

void cli_print_help(const cli_spec *spec);

/* The text given for an option (NULL when absent). `name` must be in the table. */
const char *cli_get(const cli_spec *spec, const char *name);

/* Conversions: leave *out unchanged when the option is absent. Return 0, or -1 after printing
 * a usage message (the caller returns CLI_EXIT_USAGE). */
int cli_get_size(const cli_spec *spec, const char *name, size_t min, size_t max, size_t *out);
/* A number > 0 that a float holds without becoming 0 or infinite (the library takes floats,
 * and a scale that rounds to 0 would silently mean "the default"). */
int cli_get_positive_float(const cli_spec *spec, const char *name, float *out);
/* The index of the value in choices (a NULL-terminated list). */
int cli_get_choice(const cli_spec *spec, const char *name, const char *const *choices, int *out);

/* "iha <command>: " followed by the formatted message and a newline, on stderr. */
#ifdef __GNUC__
__attribute__((format(printf, 2, 3)))
#endif
void cli_error(const cli_spec *spec, const char *format, ...);

#endif
