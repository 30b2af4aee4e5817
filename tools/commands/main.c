/*
 * main.c - the iha command: dispatches "iha <command> ..." to the cmd_<command>.c files,
 * answers --help and --version itself, and checks that standard output was written.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "commands/cli.h"
#include "iha.h"

typedef struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"devices", "list OpenCL platforms and devices with their limits", cmd_devices},
    {"check", "check every kernel this device would use against float64 (run it first on a new device)", cmd_check},
    {"forward", "run one IHA layer on the .npy files of a directory", cmd_forward},
    {"demo", "run a random layer of a realistic shape, check it, time each stage", cmd_demo},
    {"generate-check", "generate token by token through a KV cache, check against the full pass", cmd_generate_check},
    {"tune", "tune the kernels for this device into its profile (progress, before/after)", cmd_tune},
    {"profile", "show, locate or clear the device's tuning profile", cmd_profile},
    {"bench", "measure attention, a layer, the device's ceilings, an unfused baseline, cold start", cmd_bench},
    {"soak", "layer calls in a loop for a bounded time; memory and OpenCL objects must not grow", cmd_soak},
};
#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out)
{
    fprintf(out, "usage: iha <command> [options]\n"
                 "       iha --help | --version\n\n"
                 "Interleaved Head Attention on OpenCL devices (library %s).\n\ncommands:\n",
            iha_version_string());
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nRun 'iha <command> --help' for the options of a command.\n"
                 "IHA_DEVICE chooses the device when --device is not given (\"P:D\" or a name substring).\n");
}

static const command *find(const char *name)
{
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* Flushes and closes standard output for every command at once, so that a result lost to a
 * full disk or a closed pipe is a failure (exit status 1) rather than a silent success. An
 * error of an earlier write sticks in ferror; errno then no longer tells which, and is left
 * out of the message. */
static int finish_stdout(int code)
{
    int earlier = ferror(stdout);
    errno = 0;
    int closed = fclose(stdout) == 0;
    if (closed && !earlier)
        return code;
    int why = closed ? 0 : errno;
    fprintf(stderr, "iha: cannot write to standard output%s%s\n", why ? ": " : "", why ? strerror(why) : "");
    return code == CLI_EXIT_OK ? CLI_EXIT_FAILURE : code;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *first = argv[1];
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0) {
        print_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(first, "--version") == 0) {
        printf("iha %s\n", iha_version_string());
        return CLI_EXIT_OK;
    }
    /* "iha help forward" is the same as "iha forward --help". */
    if (strcmp(first, "help") == 0) {
        if (argc < 3) {
            print_usage(stdout);
            return CLI_EXIT_OK;
        }
        const command *c = find(argv[2]);
        char help[] = "--help";
        char *help_argv[] = {argv[2], help, NULL};
        if (c)
            return c->run(2, help_argv);
        first = argv[2];
    }
    const command *c = find(first);
    if (!c) {
        fprintf(stderr, "iha: unknown command '%s'\n\n", first);
        print_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    return c->run(argc - 1, argv + 1);
}

int main(int argc, char **argv) { return finish_stdout(dispatch(argc, argv)); }
