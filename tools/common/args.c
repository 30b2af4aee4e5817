/*
 * args.c - the long-option parser and value conversions of args.h.
 */
#include "common/args.h"

#include <errno.h>
#include <float.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands/cli.h"

const char *cli_program = "iha";

void cli_error(const cli_spec *spec, const char *format, ...)
{
    va_list args;
    fprintf(stderr, "%s %s: ", cli_program, spec->command);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
}

void cli_print_help(const cli_spec *spec)
{
    printf("usage: %s %s%s%s\n\n%s\n\noptions:\n", cli_program, spec->command, *spec->synopsis ? " " : "",
           spec->synopsis, spec->description);
    for (const cli_option *o = spec->options; o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->value_name ? " " : "", o->value_name ? o->value_name : "");
        printf("  %-22s %s\n", left, o->help);
    }
    printf("  %-22s %s\n", "--help", "show this help");
}

static cli_option *find(const cli_spec *spec, const char *name, size_t len)
{
    for (cli_option *o = spec->options; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

int cli_parse(cli_spec *spec, int argc, char **argv)
{
    for (cli_option *o = spec->options; o->name; o++) o->value = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            cli_print_help(spec);
            return CLI_EXIT_OK;
        }
        if (strncmp(arg, "--", 2) != 0) {
            cli_error(spec, "unexpected argument '%s' (see '%s %s --help')", arg, cli_program, spec->command);
            return CLI_EXIT_USAGE;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        cli_option *o = find(spec, name, len);
        if (!o) {
            cli_error(spec, "unknown option '--%.*s' (see '%s %s --help')", (int)len, name, cli_program, spec->command);
            return CLI_EXIT_USAGE;
        }
        if (o->value) {
            cli_error(spec, "option --%s is given more than once", o->name);
            return CLI_EXIT_USAGE;
        }
        if (!o->value_name) {
            if (eq) {
                cli_error(spec, "option --%s takes no value", o->name);
                return CLI_EXIT_USAGE;
            }
            o->value = "";
        } else if (eq) {
            o->value = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            o->value = argv[++i];
        } else {
            cli_error(spec, "option --%s needs a value (%s)", o->name, o->value_name);
            return CLI_EXIT_USAGE;
        }
    }
    return -1;
}

const char *cli_get(const cli_spec *spec, const char *name)
{
    const cli_option *o = find(spec, name, strlen(name));
    return o ? o->value : NULL;
}

int cli_get_size(const cli_spec *spec, const char *name, size_t min, size_t max, size_t *out)
{
    const char *text = cli_get(spec, name);
    if (!text) return 0;
    /* Digits only: strtoull would accept "-1" (as a huge value), spaces and a sign. */
    size_t value = 0;
    int ok = *text != '\0';
    for (const char *p = text; ok && *p; p++) {
        if (*p < '0' || *p > '9' || value > (SIZE_MAX - (size_t)(*p - '0')) / 10)
            ok = 0;
        else
            value = value * 10 + (size_t)(*p - '0');
    }
    if (!ok || value < min || value > max) {
        cli_error(spec, "--%s must be an integer from %zu to %zu, got '%s'", name, min, max, text);
        return -1;
    }
    *out = value;
    return 0;
}

int cli_get_positive_float(const cli_spec *spec, const char *name, float *out)
{
    const char *text = cli_get(spec, name);
    if (!text) return 0;
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (*text == '\0' || *end != '\0' || errno == ERANGE || !(value >= FLT_MIN && value <= FLT_MAX)) {
        cli_error(spec, "--%s must be a number from %g to %g, got '%s'", name, FLT_MIN, FLT_MAX, text);
        return -1;
    }
    *out = (float)value;
    return 0;
}

int cli_get_choice(const cli_spec *spec, const char *name, const char *const *choices, int *out)
{
    const char *text = cli_get(spec, name);
    if (!text) return 0;
    for (int i = 0; choices[i]; i++) {
        if (strcmp(text, choices[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    char list[256] = "";
    for (int i = 0; choices[i]; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
    }
    cli_error(spec, "--%s must be one of %s, got '%s'", name, list, text);
    return -1;
}
