/* Linked into every executable of a sanitizer build (cmake/Sanitizers.cmake).
 * - The sanitizers' default options and LeakSanitizer's suppressions, so that a plain `ctest`
 *   in the build directory runs as CI does; ASAN_OPTIONS, LSAN_OPTIONS and UBSAN_OPTIONS in the
 *   environment still override them.
 * - stdout line-buffered and flushed when a sanitizer ends the process, so that the lines a
 *   test printed before an error (CMocka's "[ RUN      ] case") reach the log next to the
 *   report instead of dying in a pipe buffer. */
#include <stdio.h>

#include <sanitizer/common_interface_defs.h>

/* The sanitizer runtimes look these up by name; declared here to keep -Wmissing-prototypes
 * quiet. */
const char *__asan_default_options(void);
const char *__lsan_default_suppressions(void);
const char *__ubsan_default_options(void);
void iha__sanitizer_hooks_anchor(void);

/* strict_memcmp=0: PoCL compares names with memcmp(a, b, n) past the end of the shorter one
 * (harmless: the bytes that differ come first), which the strict default reports from inside
 * its compiler while several threads build programs. */
const char *__asan_default_options(void)
{
    return "detect_leaks=1:strict_memcmp=0:detect_stack_use_after_return=1:check_initialization_order=1";
}

/* PoCL and the LLVM/Clang it compiles kernels with keep allocations until the process exits,
 * most of them on a cold program cache. A leak whose stack passes through one of these
 * libraries is theirs; nothing of iha, CLBlast, the tools or the tests is listed. (Leaked
 * OpenCL objects of ours are allocated inside libpocl too: tests/test_faults.c and `iha soak`
 * count them through the context's reference count instead.) */
const char *__lsan_default_suppressions(void)
{
    return "leak:libpocl.so\n"
           "leak:libLLVM\n"
           "leak:libclang-cpp.so\n";
}

const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1"; }

void iha__sanitizer_hooks_anchor(void) {}

static void flush_all(void) { fflush(NULL); }

__attribute__((constructor)) static void install(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    __sanitizer_set_death_callback(flush_all);
}
