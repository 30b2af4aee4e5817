/*
 * timer.h - wall-clock timing for the subcommands that measure (demo, later bench).
 */
#ifndef IHA_TOOLS_TIMER_H
#define IHA_TOOLS_TIMER_H

#include <stddef.h>

/* Seconds on a monotonic clock: only differences mean anything. */
double timer_seconds(void);

/* The median of n > 0 values; sorts `values` in place. Medians, not means, because the first
 * runs and the odd scheduler hiccup on a shared CPU would otherwise dominate. */
double timer_median(double *values, size_t n);

#endif
