/* Whether the process has the memory and file descriptors that fetching program binaries from
 * the driver needs, so that the optional disk cache is skipped rather than crash a run. */
#ifndef IHA_RUNTIME_HEADROOM_H
#define IHA_RUNTIME_HEADROOM_H

/* 1 when asking the driver for program binaries (clGetProgramInfo with CL_PROGRAM_BINARY_SIZES
 * or CL_PROGRAM_BINARIES) fits within this process's limits; headroom.c says what it can and
 * cannot see. */
int iha__room_for_binaries(void);

/* The address space that loading the OpenCL driver and compiling kernels needs (before the
 * first OpenCL call), and that compiling needs once the driver is loaded (a context set up):
 * under an address-space limit (ulimit -v) that leaves less, PoCL aborts the process (its
 * thread start-up, LLVM's allocations) where the library cannot answer with a status. */
#define IHA_ROOM_TO_LOAD_DRIVER (512ull << 20)
#define IHA_ROOM_TO_COMPILE (128ull << 20)
/* 1 when RLIMIT_AS leaves at least `needed` bytes above what the process maps now, or sets no
 * limit; else 0, with the limit and what it leaves in bytes in *limit and *left. */
int iha__address_space_room(unsigned long long needed, unsigned long long *limit, unsigned long long *left);
#endif
