/*
 * main.c - the iha command: dispatches "iha <command> ..." to the cmd_<command>.c files and
 * answers --help and --version itself.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "iha.h"

typedef struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"devices", "list OpenCL platforms and devices with their limits", cmd_devices},
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

int main(int argc, char **argv)
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
