/* Limits checked before the driver loads and compiles, and before it serialises program
 * binaries (see headroom.h).
 *
 * Loading PoCL and compiling a first kernel maps a few hundred MiB (LLVM's libraries, a thread
 * per CPU with its stack and malloc arena); PoCL adapts some of it to a tight limit and aborts
 * where it cannot (pthread_create in its scheduler, std::bad_alloc or "LLVM ERROR: out of
 * memory" in the compiler). doc/architecture.md gives the limits at which it does. The two
 * thresholds of headroom.h lie above those, so a context is refused with a status instead.
 *
 * PoCL serialises a program into a 256 MiB scratch allocation that it does not check, so under
 * an address-space or data limit (ulimit -v) that leaves less room the process crashes inside
 * clGetProgramInfo; and it reads every file of the program's cache directory, where a process
 * without free file descriptors gets empty records. So the disk cache is written only while
 * RLIMIT_AS and RLIMIT_DATA leave MEMORY_NEEDED above what the process maps now
 * (/proc/self/statm; without /proc a finite limit counts as no room) and FDS_NEEDED descriptors
 * can still be opened (probed by opening them).
 * Not seen: a cgroup's memory limit and the machine's free memory (with overcommit the
 * allocation succeeds and the kernel's OOM killer acts later), other threads allocating at the
 * same time, and what drivers other than PoCL need. */
#include "runtime/headroom.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#define MEMORY_NEEDED (384ull << 20) /* PoCL's scratch, the binary it returns and the library's copy */
#define FDS_NEEDED 16                /* PoCL's directory walk, the files it reads, the cache writer */

/* The process's mapped size and data size in bytes, from /proc/self/statm. */
static int mapped_bytes(unsigned long long *size, unsigned long long *data)
{
    FILE *f = fopen("/proc/self/statm", "re");
    if (f == NULL) return 0;
    unsigned long long pages[6];
    const int ok = fscanf(f, "%llu %llu %llu %llu %llu %llu", &pages[0], &pages[1], &pages[2], &pages[3], &pages[4],
                          &pages[5]) == 6;
    fclose(f);
    const long page = sysconf(_SC_PAGESIZE);
    if (!ok || page <= 0) return 0;
    *size = pages[0] * (unsigned long long)page;
    *data = pages[5] * (unsigned long long)page;
    return 1;
}

static int memory_room(int resource, int have_usage, unsigned long long used)
{
    struct rlimit r;
    if (getrlimit(resource, &r) != 0) return 0;
    if (r.rlim_cur == RLIM_INFINITY) return 1;
    return have_usage && (unsigned long long)r.rlim_cur > used && (unsigned long long)r.rlim_cur - used >= MEMORY_NEEDED;
}

static int descriptor_room(void)
{
    int fds[FDS_NEEDED], opened = 0;
    while (opened < FDS_NEEDED && (fds[opened] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) ++opened;
    const int limited = opened < FDS_NEEDED && (opened > 0 || errno == EMFILE || errno == ENFILE);
    for (int i = 0; i < opened; ++i) close(fds[i]);
    return !limited; /* no /dev/null at all says nothing about the limit */
}

int iha__room_for_binaries(void)
{
    unsigned long long size = 0, data = 0;
    const int known = mapped_bytes(&size, &data);
    return memory_room(RLIMIT_AS, known, size) && memory_room(RLIMIT_DATA, known, data) && descriptor_room();
}

int iha__address_space_room(unsigned long long needed, unsigned long long *limit, unsigned long long *left)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1;
    unsigned long long size = 0, data = 0;
    const int known = mapped_bytes(&size, &data);
    *limit = (unsigned long long)r.rlim_cur;
    *left = known && *limit > size ? *limit - size : 0;
    return *left >= needed;
}
