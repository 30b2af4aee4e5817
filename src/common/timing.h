/* A monotonic clock and the median of samples, shared by stage timing, measurement and tuning. */
#ifndef IHA_COMMON_TIMING_H
#define IHA_COMMON_TIMING_H
#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC. */
double iha__now_seconds(void);
/* The median of n > 0 samples (sorts v in place). Medians, not means: on a shared machine the
 * odd descheduled run would dominate a mean. */
double iha__median(double *v, size_t n);
#endif
