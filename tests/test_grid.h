/*
 * test_grid.h - grids of test cases: factors (the planted input, its value, the mask, ...) with
 * a number of levels each. A grid's cases are every valid combination of levels, or, with
 * IHA_TEST_GRID=pairs in the environment, a pairwise cover of them: a subset in which every
 * pair of levels of every two factors that some valid combination holds appears at least once.
 * A simulator that costs seconds a launch (.ci/oclgrind.sh) runs the cover; the devices that
 * run the whole grid check every combination.
 */
#ifndef IHA_TESTS_TEST_GRID_H
#define IHA_TESTS_TEST_GRID_H

#include <stddef.h>

#define TU_GRID_MAX_FACTORS 6

/* One case: a level of each factor. */
typedef struct tu_grid_case {
    int level[TU_GRID_MAX_FACTORS];
} tu_grid_case;

/* 1 when a combination is a case of the grid (NULL: every combination is). */
typedef int (*tu_grid_valid)(const tu_grid_case *c, const void *data);

/* The grid's cases, malloc'd (free it), their number in *count: every valid combination in
 * the product's order (the last factor varies fastest), or the cover in the order it was
 * built; fails the test when out of memory or when factors is not in
 * 1..TU_GRID_MAX_FACTORS. levels[i] is factor i's number of levels. */
tu_grid_case *tu_grid_cases(const int *levels, int factors, tu_grid_valid valid, const void *data, size_t *count);

/* 1 when IHA_TEST_GRID=pairs asks for pairwise covers. */
int tu_grid_pairwise(void);

#endif
