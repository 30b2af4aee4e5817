/*
 * mask_names.h - the command-line names of the iha_mask values, in enum order, so that an
 * option's choice index is the mask itself.
 */
#ifndef IHA_TOOLS_MASK_NAMES_H
#define IHA_TOOLS_MASK_NAMES_H

/* {"causal", "token_causal", "none", NULL}: indexed by iha_mask, NULL-terminated for
 * cli_get_choice. */
extern const char *const mask_names[];

#endif
