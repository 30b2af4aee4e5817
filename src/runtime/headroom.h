/* Whether the process has the memory and file descriptors that fetching program binaries from
 * the driver needs, so that the optional disk cache is skipped rather than crash a run. */
#ifndef IHA_RUNTIME_HEADROOM_H
#define IHA_RUNTIME_HEADROOM_H

/* 1 when asking the driver for program binaries (clGetProgramInfo with CL_PROGRAM_BINARY_SIZES
 * or CL_PROGRAM_BINARIES) fits within this process's limits; headroom.c says what it can and
 * cannot see. */
int iha__room_for_binaries(void);
#endif
