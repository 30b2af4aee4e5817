/*
 * test_cli.c - the iha command end to end, run as a child process (argv[1] is its path): what
 * `iha forward --out` may replace and how, inputs that are not regular files, a failed write
 * to standard output, and exit status 2 for usage and range errors in every command. The
 * fixtures are written with the tool's own .npy writer, special files only in a temporary
 * directory of the test's own.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, mkfifo, mknod, symlink, S_IFCHR */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/npy.h"
#include "test_files.h"

static const char *iha_path;

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define IHA_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define IHA_TEST_SANITIZED 1
#endif
/* The tests and the iha they run come from one build: sanitized or not alike. */
#ifdef IHA_TEST_SANITIZED
static const int built_with_sanitizer = 1;
#else
static const int built_with_sanitizer = 0;
#endif
/* RLIMIT_AS of the children run_iha starts, in KiB (ulimit -v); 0: inherited. */
static unsigned long child_address_space_kib;

typedef struct run_result {
    int status;    /* the exit status; -1 when killed by a signal or the timeout */
    int timed_out; /* 1 when the timeout killed it */
    char err[8192];
} run_result;

/* Runs iha with `args` (NULL-terminated) for at most timeout_s seconds, standard output going
 * to stdout_path (opened for writing, never created or truncated; NULL: /dev/null) and
 * standard error captured in r->err. */
static void run_iha(const char *const *args, const char *stdout_path, int timeout_s, run_result *r)
{
    char err_path[512];
    tf_path(err_path, sizeof err_path, "stderr.txt");
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int out_fd = open(stdout_path ? stdout_path : "/dev/null", O_WRONLY | O_NOCTTY);
    assert_true(err_fd >= 0 && out_fd >= 0);
    char *argv[40];
    size_t argc = 0;
    argv[argc++] = (char *)iha_path;
    for (; args[argc - 1] && argc < 39; argc++)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
            _exit(126);
        const struct rlimit as = {(rlim_t)child_address_space_kib << 10, (rlim_t)child_address_space_kib << 10};
        if (child_address_space_kib && setrlimit(RLIMIT_AS, &as) != 0)
            _exit(126);
        execv(iha_path, argv);
        _exit(127);
    }
    close(out_fd);
    close(err_fd);
    memset(r, 0, sizeof *r);
    int status = 0;
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (long waited = 0;; waited++) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        assert_true(done >= 0);
        if (done == pid)
            break;
        if (waited >= timeout_s * 100L) {
            kill(pid, SIGKILL);
            assert_int_equal(waitpid(pid, &status, 0), pid);
            r->timed_out = 1;
            break;
        }
        nanosleep(&tick, NULL);
    }
    r->status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    FILE *f = fopen(err_path, "r");
    assert_non_null(f);
    size_t n = fread(r->err, 1, sizeof r->err - 1, f);
    r->err[n] = '\0';
    fclose(f);
}

static void expect_status(const run_result *r, int status, const char *what)
{
    if (r->timed_out)
        fail_msg("%s: still running at the timeout", what);
    if (r->status != status)
        fail_msg("%s: exit status %d, expected %d; stderr:\n%s", what, r->status, status, r->err);
}

static void expect_stderr(const run_result *r, const char *needle, const char *what)
{
    if (!strstr(r->err, needle))
        fail_msg("%s: stderr does not mention '%s':\n%s", what, needle, r->err);
}

/* ---- iha forward ---------------------------------------------------------------------- */

/* A small layer: B=1 N=4 D=8, H=2 d=4 P=2, deterministic values, x's times x_scale. */
static void write_layer(const char *dir, int x_as_fifo, float x_scale)
{
    static const struct {
        const char *name;
        size_t ndim, shape[3];
    } files[] = {
        {"x.npy", 3, {1, 4, 8}},      {"wq.npy", 2, {8, 8}},        {"wk.npy", 2, {8, 8}},
        {"wv.npy", 2, {8, 8}},        {"wo.npy", 2, {8, 8}},        {"alpha_q.npy", 3, {2, 2, 2}},
        {"alpha_k.npy", 3, {2, 2, 2}}, {"alpha_v.npy", 3, {2, 2, 2}}, {"r.npy", 3, {2, 2, 2}},
    };
    float values[64];
    for (size_t i = 0; i < 64; i++)
        values[i] = (float)(0.3 * sin(1.7 * (double)i + 0.4));
    assert_int_equal(mkdir(dir, 0700), 0);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], err[256];
        int n = snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        assert_true(n > 0 && (size_t)n < sizeof path);
        if (i == 0 && x_as_fifo) {
            assert_int_equal(mkfifo(path, 0600), 0);
            continue;
        }
        float scaled[64];
        for (size_t k = 0; k < 64; k++)
            scaled[k] = i == 0 ? values[k] * x_scale : values[k];
        if (npy_write_f32(path, files[i].shape, files[i].ndim, scaled, err, sizeof err))
            fail_msg("writing %s: %s", path, err);
    }
}

static void remove_layer(const char *dir)
{
    static const char *const names[] = {"x.npy",       "wq.npy",      "wk.npy",      "wv.npy", "wo.npy",
                                        "alpha_q.npy", "alpha_k.npy", "alpha_v.npy", "r.npy"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        int n = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        assert_true(n > 0 && (size_t)n < sizeof path);
        assert_int_equal(unlink(path), 0);
    }
    assert_int_equal(rmdir(dir), 0);
}

static char layer_dir[512];

static void forward(const char *out, run_result *r)
{
    const char *args[] = {"forward", "--in", layer_dir, "--out", out, NULL};
    run_iha(args, NULL, 300, r);
}

/* A run that needs a device, skipped (with the line CTest's skip pattern looks for) without one. */
static void forward_on_device(const char *out, run_result *r)
{
    forward(out, r);
    if (r->status != 0 && strstr(r->err, "IHA_ERROR_NO_DEVICE")) {
        print_message("iha-test: no OpenCL device\n");
        skip();
    }
    expect_status(r, 0, out);
}

/* Z [1, 4, 8] at path, finite. */
static void expect_output(const char *path)
{
    npy_array z;
    tf_read_npy(path, &z);
    assert_int_equal(z.header.ndim, 3);
    assert_int_equal(z.header.count, 32);
    for (size_t i = 0; i < z.header.count; i++)
        assert_true(isfinite(z.data[i]));
    npy_free(&z);
}

/* layer_dir/seq_lens.npy: a 1-D int64 array, as numpy.save writes np.array(lens). */
static void write_seq_lens(const long long *lens, size_t count)
{
    char path[1024], dict[128], header[256];
    snprintf(path, sizeof path, "%s/seq_lens.npy", layer_dir);
    snprintf(dict, sizeof dict, "{'descr': '<i8', 'fortran_order': False, 'shape': (%zu,), }", count);
    const size_t used = 10 + strlen(dict) + 1, padded = (used + 63) / 64 * 64;
    snprintf(header, sizeof header, "%-*s\n", (int)(padded - 10 - 1), dict);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(padded - 10), 0};
    assert_int_equal(fwrite(prefix, 1, 10, f), 10);
    assert_int_equal(fwrite(header, 1, padded - 10, f), padded - 10);
    for (size_t i = 0; i < count; i++) {
        unsigned char v[8];
        for (int k = 0; k < 8; k++) v[k] = (unsigned char)((unsigned long long)lens[i] >> (8 * k));
        assert_int_equal(fwrite(v, 1, 8, f), 8);
    }
    assert_int_equal(fclose(f), 0);
}

/* seq_lens.npy beside the inputs packs the row's 4 tokens as sequences of 1 and 3: z changes
 * from the unpacked run's (token 1 no longer sees token 0); lengths that do not sum to N are
 * refused with exit status 1. */
static void forward_reads_seq_lens(void **state)
{
    (void)state;
    char out[512], packed[512], seq_path[1024];
    tf_path(out, sizeof out, "z_unpacked.npy");
    tf_path(packed, sizeof packed, "z_packed.npy");
    snprintf(seq_path, sizeof seq_path, "%s/seq_lens.npy", layer_dir);
    run_result r;
    forward_on_device(out, &r);
    static const long long lens[2] = {1, 3}, bad[2] = {1, 2};
    write_seq_lens(lens, 2);
    forward(packed, &r);
    expect_status(&r, 0, "forward with seq_lens.npy");
    npy_array a, b;
    tf_read_npy(out, &a);
    tf_read_npy(packed, &b);
    assert_int_equal(a.header.count, b.header.count);
    assert_memory_equal(a.data, b.data, 8 * sizeof(float)); /* token 0: a sequence of its own either way */
    assert_memory_not_equal(a.data + 8, b.data + 8, 24 * sizeof(float));
    npy_free(&a);
    npy_free(&b);
    write_seq_lens(bad, 2);
    forward(packed, &r);
    expect_status(&r, 1, "forward with seq_lens.npy summing to 3 of 4 tokens");
    expect_stderr(&r, "seq_lens sum to 3", "the wrong sum");
    assert_int_equal(unlink(seq_path), 0);
    unlink(out);
    unlink(packed);
}

/* --half and --bf16 store the layer in 16 bits on the device: Z differs from the float run's,
 * within their contracts (relative L2 2e-3 and 1e-2 against float64; the float run is within
 * 1e-5 of it). */
static void forward_16bit_storage_close_to_float(void **state)
{
    (void)state;
    char out[512], out16[512];
    run_result r;
    tf_path(out, sizeof out, "z_float.npy");
    tf_path(out16, sizeof out16, "z_16bit.npy");
    forward_on_device(out, &r);
    npy_array z;
    tf_read_npy(out, &z);
    static const char *const flags[2] = {"--half", "--bf16"};
    static const double limits[2] = {2e-3, 1e-2};
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"forward", "--in", layer_dir, "--out", out16, flags[i], NULL};
        run_iha(args, NULL, 300, &r);
        expect_status(&r, 0, flags[i]);
        npy_array z16;
        tf_read_npy(out16, &z16);
        assert_int_equal(z16.header.count, z.header.count);
        double diff = 0, norm = 0;
        for (size_t k = 0; k < z.header.count; k++) {
            diff += (z16.data[k] - z.data[k]) * (z16.data[k] - z.data[k]);
            norm += z.data[k] * z.data[k];
        }
        /* Above 0: the rounding to 16 bits took place. */
        if (!(sqrt(diff / norm) <= limits[i] + 1e-5) || diff == 0)
            fail_msg("%s: relative L2 difference %.3e from the float run", flags[i], sqrt(diff / norm));
        npy_free(&z16);
    }
    npy_free(&z);
    assert_int_equal(unlink(out), 0);
    assert_int_equal(unlink(out16), 0);
}

/* --half on an x scaled below half's normal range (1e-6) and below its subnormals (1e-9): the
 * run succeeds, as the range is the user's choice, but standard error says what x lost; at the
 * default scale nothing is said. */
static void forward_half_warns_below_range(void **state)
{
    (void)state;
    static const struct {
        float scale;
        const char *says; /* NULL: no warning */
    } cases[] = {{1.0f, NULL},
                 {1e-6f, "x: 32 of 32 values are below half's normal range (6.1e-05) and lose precision"},
                 {1e-9f, "32 of them flush to zero"}};
    char dir[512], out[512];
    tf_path(dir, sizeof dir, "tiny_layer");
    tf_path(out, sizeof out, "z_tiny.npy");
    run_result r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_layer(dir, 0, cases[i].scale);
        const char *args[] = {"forward", "--in", dir, "--out", out, "--half", NULL};
        run_iha(args, NULL, 300, &r);
        if (r.status != 0 && strstr(r.err, "IHA_ERROR_NO_DEVICE")) {
            print_message("iha-test: no OpenCL device\n");
            skip();
        }
        expect_status(&r, 0, "iha forward --half");
        if (cases[i].says)
            expect_stderr(&r, cases[i].says, "iha forward --half");
        else if (strstr(r.err, "warning"))
            fail_msg("iha forward --half at x's own scale warned:\n%s", r.err);
        remove_layer(dir);
    }
    assert_int_equal(unlink(out), 0);
}

/* A new path, then the same file replaced: it keeps its mode (bits a new file never gets) and
 * as root its owner. */
static void out_new_then_replaced_keeps_mode(void **state)
{
    (void)state;
    char out[512];
    run_result r;
    struct stat st;
    tf_path(out, sizeof out, "z.npy");
    forward_on_device(out, &r);
    expect_output(out);
    assert_int_equal(chmod(out, 0751), 0);
    const int as_root = geteuid() == 0;
    if (as_root)
        assert_int_equal(chown(out, 4321, 4322), 0);
    forward_on_device(out, &r);
    assert_int_equal(stat(out, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0751);
    if (as_root) {
        assert_int_equal(st.st_uid, 4321);
        assert_int_equal(st.st_gid, 4322);
    }
    expect_output(out);
    assert_int_equal(unlink(out), 0);
}

/* As numpy.save: the link stays a link and its target gets Z. */
static void out_symlink_writes_its_target(void **state)
{
    (void)state;
    char link[512], target[512];
    run_result r;
    tf_path(link, sizeof link, "z_link.npy");
    tf_path(target, sizeof target, "z_target.npy");
    tf_write_text(target, "not yet a .npy file");
    assert_int_equal(symlink("z_target.npy", link), 0);
    forward_on_device(link, &r);
    tf_expect_link(link, "z_target.npy");
    expect_output(target);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(unlink(target), 0);
}

/* Refused before the run, with exit status 1, and left as they are. The device node is a twin
 * of /dev/null made in the temporary directory (root only), never an entry of /dev. */
static void out_refuses_fifo_directory_device(void **state)
{
    (void)state;
    char fifo[512], dir[512], link[512], device[512];
    run_result r;
    struct stat st;
    tf_path(fifo, sizeof fifo, "z_fifo.npy");
    tf_path(dir, sizeof dir, "z_dir.npy");
    tf_path(link, sizeof link, "z_link_to_fifo.npy");
    tf_path(device, sizeof device, "z_device.npy");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(symlink("z_fifo.npy", link), 0);
    forward(fifo, &r);
    expect_status(&r, 1, "--out FIFO");
    expect_stderr(&r, "is a FIFO", "--out FIFO");
    assert_true(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
    forward(link, &r);
    expect_status(&r, 1, "--out link to a FIFO");
    expect_stderr(&r, "is a FIFO", "--out link to a FIFO");
    assert_true(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    forward(dir, &r);
    expect_status(&r, 1, "--out directory");
    expect_stderr(&r, "is a directory", "--out directory");
    assert_true(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode));
    if (geteuid() == 0 && mknod(device, S_IFCHR | 0600, makedev(1, 3)) == 0) {
        forward(device, &r);
        int still_device = lstat(device, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
        assert_int_equal(unlink(device), 0);
        expect_status(&r, 1, "--out device node");
        expect_stderr(&r, "is a character device", "--out device node");
        assert_true(still_device);
    } else {
        print_message("device node case not run: creating one needs root (and CAP_MKNOD)\n");
    }
    assert_int_equal(unlink(link), 0);
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Opening a FIFO for reading waits for a writer: a hang until the timeout is the failure. */
static void input_fifo_refused_at_once(void **state)
{
    (void)state;
    char dir[512], out[512];
    run_result r;
    tf_path(dir, sizeof dir, "layer_fifo");
    tf_path(out, sizeof out, "z_from_fifo.npy");
    write_layer(dir, 1, 1.0f);
    const char *args[] = {"forward", "--in", dir, "--out", out, NULL};
    run_iha(args, NULL, 30, &r);
    remove_layer(dir);
    expect_status(&r, 1, "x.npy a FIFO");
    expect_stderr(&r, "x.npy: is a FIFO", "x.npy a FIFO");
    assert_int_equal(access(out, F_OK), -1);
}

/* ---- Standard output -------------------------------------------------------------------- */

/* /dev/full is only opened for writing, which cannot change it. */
static void stdout_write_failure_exits_1(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        print_message("skipped: no writable /dev/full\n");
        skip();
    }
    static const char *const cases[][4] = {
        {"--help", NULL}, {"--version", NULL}, {"help", NULL}, {"help", "forward", NULL},
        {"forward", "--help", NULL}, {"demo", "--help", NULL}, {"devices", NULL},
    };
    run_result r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[128];
        snprintf(what, sizeof what, "iha %s%s%s > /dev/full", cases[i][0], cases[i][1] ? " " : "",
                 cases[i][1] ? cases[i][1] : "");
        run_iha(cases[i], NULL, 120, &r);
        if (strcmp(cases[i][0], "devices") == 0 && r.status != 0) {
            print_message("%s not run: no OpenCL device\n", what);
            continue;
        }
        expect_status(&r, 0, what); /* the same command to /dev/null succeeds */
        run_iha(cases[i], "/dev/full", 120, &r);
        expect_status(&r, 1, what);
        expect_stderr(&r, "iha: cannot write to standard output", what);
    }
}

/* ---- Exit status 2 ---------------------------------------------------------------------- */

/* Refused while reading the command line: no device is needed, and none is used. */
static void usage_and_range_errors_exit_2(void **state)
{
    (void)state;
    static const char *const cases[][12] = {
        {NULL},
        {"no-such-command", NULL},
        {"devices", "--all", NULL},
        {"profile", "rename", NULL},
        {"forward", NULL},
        {"forward", "--in", "d", "--out", "z.npy", "--window", "-3", NULL},
        {"forward", "--in", "d", "--out", "z.npy", "--mask", "diagonal", NULL},
        {"forward", "--in", "d", "--out", "z.npy", "--half", "--bf16", NULL},
        {"demo", "--half", "--bf16", NULL},
        {"bench", "--bf16", "--half-weights", "--no-ceilings", NULL},
        {"bench", "--bf16", "--no-layer", "--no-ceilings", NULL},
        {"demo", "--d", "300", NULL},
        {"demo", "--d", "0", NULL},
        {"demo", "--n", "16777216", "--p", "256", "--model-dim", "1", "--heads", "1", "--d", "1", NULL},
        {"demo", "--rope-base", "10000", "--d", "7", NULL},
        {"generate-check", "--d", "300", NULL},
        {"generate-check", "--mask", "none", NULL},
        {"generate-check", "--rope-base", "10000", "--d", "7", NULL},
        {"bench", "--d", "300", "--no-ceilings", "--no-layer", "--no-baseline", "--no-cold-start", NULL},
        {"bench", "--decode", "--cache-tokens", "4194304", "--p", "256", "--no-ceilings", NULL},
        {"bench", "--rope-base", "10000", "--no-ceilings", NULL},
        {"bench", "--decode", "--rope-base", "10000", "--d", "7", "--no-ceilings", NULL},
        {"soak", "--d", "300", NULL},
        {"soak", "--seconds", "2", NULL},
        {"tune", "--budget-s", "0", NULL},
        {"tune", "--widths", "0", NULL},
        {"tune", "--widths", "64,64", NULL},
        {"tune", "--widths", "257", NULL},
        {"tune", "--widths", "64,", NULL},
        {"tune", "--widths", "1,2,3,4,5,6,7,8,9", NULL},
    };
    run_result r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[256] = "iha";
        for (size_t k = 0; cases[i][k]; k++) {
            size_t used = strlen(what);
            snprintf(what + used, sizeof what - used, " %s", cases[i][k]);
        }
        run_iha(cases[i], NULL, 120, &r);
        expect_status(&r, 2, what);
        expect_stderr(&r, "iha", what);
    }
}

/* ---- iha tune --------------------------------------------------------------------------- */

/* --widths tunes the shape at each head width: the table has a bucket of each width, and the
 * GEMM shapes and the model width scale with it. */
static void tune_widths_covers_each(void **state)
{
    (void)state;
    char out_path[512];
    tf_path(out_path, sizeof out_path, "tune.txt");
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    close(fd);
    const char *args[] = {"tune", "--shapes", "1,32,32,2,16,2", "--widths", "16,24", "--kernels", "attention",
                          "--layers", "global", "--budget-s", "20", "--reps", "1", "--dry-run", NULL};
    run_result r;
    run_iha(args, out_path, 300, &r);
    expect_status(&r, 0, "iha tune --widths 16,24");
    FILE *f = fopen(out_path, "r");
    assert_non_null(f);
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    if (!strstr(text, "D=32,48 H=2 d=16,24") || !strstr(text, "attention mask=0 windowed=0 elem_bytes=4 d=16 ") ||
        !strstr(text, "attention mask=0 windowed=0 elem_bytes=4 d=24 "))
        fail_msg("iha tune --widths 16,24: a width is missing from its output:\n%s", text);
}

/* ---- A tight address-space limit --------------------------------------------------------- */

/* Under ulimit -v 150000 every command exits: no BLAS threads loop at exit (only "iha bench"
 * opens a BLAS), and a command that needs the device is refused with the limit named, before the
 * OpenCL driver aborts. */
static void tight_address_space_exits(void **state)
{
    (void)state;
    /* A sanitizer reserves its shadow memory at start-up, far beyond such a limit. */
    if (built_with_sanitizer) skip();
    static const char *const version[] = {"--version", NULL}, *const devices[] = {"devices", NULL};
    static const char *const demo[] = {"demo", "--n", "16", "--model-dim", "16", "--heads", "1", "--d", "8", NULL};
    child_address_space_kib = 150000;
    run_result r;
    run_iha(version, NULL, 30, &r);
    expect_status(&r, 0, "iha --version under ulimit -v 150000");
    run_iha(devices, NULL, 30, &r);
    if (r.timed_out)
        fail_msg("iha devices under ulimit -v 150000: still running at the timeout");
    run_iha(demo, NULL, 30, &r);
    expect_status(&r, 1, "iha demo under ulimit -v 150000");
    expect_stderr(&r, "address-space limit (ulimit -v", "iha demo under ulimit -v 150000");
}

/* Every test's children start with the inherited limit, also after a test that failed midway. */
static int unlimited_children(void **state)
{
    (void)state;
    child_address_space_kib = 0;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    if (tf_make_dir("iha_test_cli"))
        return -1;
    tf_path(layer_dir, sizeof layer_dir, "layer");
    write_layer(layer_dir, 0, 1.0f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char err_path[512];
    tf_path(err_path, sizeof err_path, "stderr.txt");
    unlink(err_path);
    remove_layer(layer_dir);
    return rmdir(tf_dir);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_cli PATH_OF_IHA\n");
        return 2;
    }
    iha_path = argv[1];
    /* setenv(..., 0) keeps a value the caller chose. */
    setenv("IHA_CACHE_DIR", IHA_TEST_BINARY_DIR "/cache/iha", 0);
    setenv("POCL_CACHE_DIR", IHA_TEST_BINARY_DIR "/cache/pocl", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(out_new_then_replaced_keeps_mode),
        cmocka_unit_test(forward_16bit_storage_close_to_float),
        cmocka_unit_test(forward_half_warns_below_range),
        cmocka_unit_test(out_symlink_writes_its_target),
        cmocka_unit_test(out_refuses_fifo_directory_device),
        cmocka_unit_test(input_fifo_refused_at_once),
        cmocka_unit_test(stdout_write_failure_exits_1),
        cmocka_unit_test(usage_and_range_errors_exit_2),
        cmocka_unit_test(tune_widths_covers_each),
        cmocka_unit_test_teardown(tight_address_space_exits, unlimited_children),
        cmocka_unit_test(forward_reads_seq_lens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
