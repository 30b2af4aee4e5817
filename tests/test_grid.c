/* Grids of test cases and their pairwise covers (test_grid.h). The cover is built greedily:
 * each step takes the first combination that covers the most pairs not yet covered, so the
 * same grid gives the same cases on every run and every machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "test_grid.h"
#include "test_util.h"

int tu_grid_pairwise(void)
{
    const char *g = getenv("IHA_TEST_GRID");
    return g != NULL && strcmp(g, "pairs") == 0;
}

/* The index of pair (factor a at level la, factor b at level lb), a < b, in a table with a
 * slot for every level of every two factors. */
static size_t pair_index(const int *levels, int factors, int a, int la, int b, int lb)
{
    size_t base = 0;
    for (int i = 0; i < factors; i++)
        for (int j = i + 1; j < factors; j++) {
            if (i == a && j == b) return base + (size_t)la * (size_t)levels[b] + (size_t)lb;
            base += (size_t)levels[i] * (size_t)levels[j];
        }
    return base;
}

/* Pairs of c not yet marked in `covered` (marking them with `mark`). */
static size_t new_pairs(const int *levels, int factors, const tu_grid_case *c, unsigned char *covered, int mark)
{
    size_t n = 0;
    for (int a = 0; a < factors; a++)
        for (int b = a + 1; b < factors; b++) {
            unsigned char *slot = &covered[pair_index(levels, factors, a, c->level[a], b, c->level[b])];
            if (*slot) continue;
            ++n;
            if (mark) *slot = 1;
        }
    return n;
}

tu_grid_case *tu_grid_cases(const int *levels, int factors, tu_grid_valid valid, const void *data, size_t *count)
{
    assert_true(factors >= 1 && factors <= TU_GRID_MAX_FACTORS);
    size_t total = 1;
    for (int i = 0; i < factors; i++) {
        assert_true(levels[i] >= 1);
        total *= (size_t)levels[i];
    }
    tu_grid_case *all = tu_malloc(total * sizeof *all);
    size_t n = 0;
    for (size_t k = 0; k < total; k++) {
        tu_grid_case c;
        memset(&c, 0, sizeof c);
        size_t rest = k;
        for (int i = factors - 1; i >= 0; i--) {
            c.level[i] = (int)(rest % (size_t)levels[i]);
            rest /= (size_t)levels[i];
        }
        if (valid == NULL || valid(&c, data)) all[n++] = c;
    }
    *count = n;
    if (!tu_grid_pairwise() || factors < 2) return all;

    const size_t slots = pair_index(levels, factors, factors, 0, factors, 0);
    unsigned char *covered = tu_malloc(slots ? slots : 1);
    /* Pairs no valid combination holds count as covered: they cannot be. */
    memset(covered, 1, slots ? slots : 1);
    for (size_t k = 0; k < n; k++)
        for (int a = 0; a < factors; a++)
            for (int b = a + 1; b < factors; b++)
                covered[pair_index(levels, factors, a, all[k].level[a], b, all[k].level[b])] = 0;
    tu_grid_case *cover = tu_malloc((n ? n : 1) * sizeof *cover);
    size_t m = 0;
    for (;;) {
        /* A case already taken has no pair left to cover, so it is never taken twice. */
        size_t best = n, best_new = 0;
        for (size_t k = 0; k < n; k++) {
            const size_t fresh = new_pairs(levels, factors, &all[k], covered, 0);
            if (fresh > best_new) best = k, best_new = fresh;
        }
        if (best == n) break;
        new_pairs(levels, factors, &all[best], covered, 1);
        cover[m++] = all[best];
    }
    free(covered);
    free(all);
    *count = m;
    return cover;
}
