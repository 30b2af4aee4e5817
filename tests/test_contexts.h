/*
 * test_contexts.h - the contexts the several-contexts tests (test_multi.c, test_multi_layer.c)
 * run on: tu_ctx and MAX_R - 1 more on the same device, opened by the group setup and freed by
 * its teardown; and the layout of every part's tensors in its buffer (an offset, then guard
 * floats holding a sentinel).
 */
#ifndef IHA_TEST_CONTEXTS_H
#define IHA_TEST_CONTEXTS_H

#include "test_util.h"

#define MAX_R 3
#define OFFSET 3 /* every part's tensors start this many floats into their buffers */
#define GUARD 5  /* and have this many floats of sentinel after them */
#define SENTINEL 7.25f

static iha_context *ctxs[MAX_R];

static int setup(void **state)
{
    if (tu_group_setup(state) != 0) return -1;
    ctxs[0] = tu_ctx;
    for (int i = 1; i < MAX_R && tu_ctx != NULL; ++i)
        if (tu_context_open(&ctxs[i], NULL) != 0) return -1;
    return 0;
}

static int teardown(void **state)
{
    for (int i = 1; i < MAX_R; ++i) iha_context_free(ctxs[i]);
    return tu_group_teardown(state);
}

#endif
