/*
 * cli.h - what every subcommand of the iha tool shares: exit codes and the entry points
 * that tools/commands/main.c dispatches to. Adding a subcommand is one cmd_<name>.c file, one line
 * here and one row in main.c's table.
 */
#ifndef IHA_TOOLS_CLI_H
#define IHA_TOOLS_CLI_H

/* Exit codes: scripts tell a mistyped command line from a failed run. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

/* Each takes the arguments after "iha": argv[0] is the subcommand's own name. */
int cmd_devices(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_generate_check(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_soak(int argc, char **argv);

#endif
