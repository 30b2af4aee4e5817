/*
 * mask_names.c - the table of mask_names.h.
 */
#include "common/mask_names.h"

#include <stddef.h>

const char *const mask_names[] = {"causal", "token_causal", "none", NULL};
