/*
 * test_address_space.c - an address-space limit (ulimit -v) too tight for the OpenCL driver:
 * the context is refused with a status and a message that names the limit, in a child process
 * whose limit is set before anything of OpenCL is loaded; no process aborts. (Limits that leave
 * no room for fetching binaries only, where the layer runs without the disk cache, are in
 * test_disk_cache.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "reliability.h"
#include "test_layer.h"
#include "test_util.h"

/* The child: RLIMIT_AS `room_mib` MiB above what it maps, then a context and, where one is made,
 * the small layer. Exit 0 for a refusal that names the limit or a right result; 10 for a
 * refusal of another kind; 3 when the limit cannot be set. */
static int limited_child(long room_mib)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f == NULL || fscanf(f, "%llu", &pages) != 1)
        return 3;
    fclose(f);
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0)
        return 3;
    r.rlim_cur = (rlim_t)(pages * (unsigned long long)sysconf(_SC_PAGESIZE) + ((unsigned long long)room_mib << 20));
    if (setrlimit(RLIMIT_AS, &r) != 0)
        return 3;
    iha_context *ctx = NULL;
    char message[1024] = "";
    const iha_status st = tu_context_create_at(&ctx, (tu_places){NULL, NULL, NULL}, message, sizeof message);
    if (st != IHA_OK) {
        printf("refused: %s: %s\n", iha_status_name(st), message);
        return st == IHA_ERROR_HOST_MEMORY && strstr(message, "address-space limit (ulimit -v") ? 0 : 10;
    }
    const int rc = rel_child_small_layer(ctx);
    iha_context_free(ctx);
    return rc;
}

/* 280 MiB is where PoCL 3.1 aborts in its compiler (loaded, context made), 230 MiB where it
 * aborts starting its threads; 100 MiB leaves it unable to load at all. */
static void tight_limit_is_refused(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const char *const rooms[] = {"280", "230", "100"};
    for (size_t i = 0; i < sizeof rooms / sizeof *rooms; ++i) {
        const char *args[] = {"--limited-child", rooms[i], NULL};
        const int rc = rel_wait(rel_spawn_self(args));
        if (rc != 0)
            fail_msg("a child with %s MiB of address space exited with %d, not a refusal naming the limit", rooms[i],
                     rc);
    }
}

int main(int argc, char **argv)
{
    tu_init_environment(); /* before a child's work too */
    if (argc == 3 && strcmp(argv[1], "--limited-child") == 0)
        return limited_child(atol(argv[2]));
    if (argc == 2 && strcmp(argv[1], "--exit-child") == 0)
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tight_limit_is_refused),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
