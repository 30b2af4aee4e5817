/*
 * cmd_profile.c - "iha profile show|path|clear": the tuning profile of one device: where it is,
 * whether it is in use (and why not), what the layer's kernels would use from it, and removal.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"
#include "iha_tune.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "profile",
    "show|path|clear [options]",
    "show: the device's tuning profile, its state (loaded, none, ignored and why, off) and\n"
    "  its file; path: only the file's path; clear: delete the file (configurations fall back to\n"
    "  the built-in defaults). The profile is written by `iha tune`.\n"
    "Exit status: 0 success (also when no profile exists), 1 failure, 2 usage.",
    options,
};

static const char *state_name(int state)
{
    switch (state) {
    case IHA_PROFILE_NONE: return "none (run `iha tune`)";
    case IHA_PROFILE_LOADED: return "loaded";
    case IHA_PROFILE_IGNORED: return "IGNORED";
    case IHA_PROFILE_OFF: return "off";
    default: return "?";
    }
}

/* Prints the file, opened without blocking and only if it is a regular file: someone may have
 * put a FIFO in its place since the library read it. */
static void print_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return;
    }
    char line[1024];
    printf("\n");
    while (fgets(line, sizeof line, f)) fputs(line, stdout);
    fclose(f);
}

static int show(const iha_profile_info *info)
{
    printf("path     %s\nstate    %s\n", info->path[0] ? info->path : "(none)", state_name(info->state));
    if (info->message[0]) printf("%s %s\n", info->state == IHA_PROFILE_LOADED ? "note    " : "reason  ", info->message);
    printf("entries  %zu\n", info->entries);
    if (info->state == IHA_PROFILE_LOADED) print_file(info->path);
    return CLI_EXIT_OK;
}

int cmd_profile(int argc, char **argv)
{
    /* The action is the first argument; the option parser sees the rest. */
    if (argc < 2 || strncmp(argv[1], "--", 2) == 0) {
        int code = cli_parse(&spec, argc, argv);
        if (code >= 0) return code;
        cli_error(&spec, "say show, path or clear (see 'iha profile --help')");
        return CLI_EXIT_USAGE;
    }
    const char *action = argv[1];
    argv[1] = argv[0];
    int code = cli_parse(&spec, argc - 1, argv + 1);
    if (code >= 0) return code;
    if (strcmp(action, "show") != 0 && strcmp(action, "path") != 0 && strcmp(action, "clear") != 0) {
        cli_error(&spec, "unknown action '%s' (show, path or clear)", action);
        return CLI_EXIT_USAGE;
    }
    iha_context *ctx;
    if (cli_open_context(&spec, NULL, &ctx)) return CLI_EXIT_FAILURE;
    iha_profile_info info;
    iha_context_profile(ctx, &info); /* IHA_ERROR_PROFILE is a state to show, not a failure */
    code = CLI_EXIT_OK;
    if (strcmp(action, "path") == 0) {
        printf("%s\n", info.path);
    } else if (strcmp(action, "show") == 0) {
        printf("device   %s\n", iha_context_device_name(ctx));
        code = show(&info);
    } else {
        const iha_status st = iha_profile_clear(ctx);
        if (st != IHA_OK) {
            cli_error(&spec, "%s: %s", iha_status_name(st), iha_context_message(ctx));
            code = CLI_EXIT_FAILURE;
        } else {
            printf("removed %s\n", info.path[0] ? info.path : "(no profile file)");
        }
    }
    iha_context_free(ctx);
    return code;
}
