/*
 * test_mpi_cli.c - "mpirun -n R iha-mpi forward" end to end: writes a random layer as NumPy
 * files, runs `iha forward` and `iha-mpi forward` under mpirun on 2 and 3 ranks on it, and
 * compares both outputs with the float64 reference, for every mask, global and with a window
 * that spans ranks, with rotary, in every layout. A plain program run by CTest:
 *   test_mpi_cli IHA IHA_MPI MPIEXEC WORKDIR
 * exits nonzero on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/npy.h"
#include "reference.h"

enum { B = 2, N = 9, D = 8, H = 2, HD = 4, P = 2 };

static int failures;

static float random_value(unsigned *state, float scale)
{
    *state = *state * 1664525u + 1013904223u;
    return scale * ((float)(*state >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
}

static int write_array(const char *dir, const char *name, const size_t *shape, size_t ndim, float *data,
                       unsigned *state, float scale)
{
    size_t n = 1;
    for (size_t i = 0; i < ndim; ++i) n *= shape[i];
    for (size_t i = 0; i < n; ++i) data[i] = random_value(state, scale);
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (npy_write_f32(path, shape, ndim, data, err, sizeof err)) {
        fprintf(stderr, "writing %s: %s\n", path, err);
        return -1;
    }
    return 0;
}

/* Runs a command line; 0 when it exited 0. */
static int run(const char *line)
{
    const int status = system(line);
    if (status != 0) {
        fprintf(stderr, "FAILED (%d): %s\n", status, line);
        ++failures;
    }
    return status;
}

static void compare(const char *path, const double *want, const char *label)
{
    npy_array a;
    char err[256];
    if (npy_read(path, &a, err, sizeof err)) {
        fprintf(stderr, "%s: reading %s: %s\n", label, path, err);
        ++failures;
        return;
    }
    double num = 0, den = 0;
    const size_t n = (size_t)B * N * D;
    if (a.header.count != n) {
        fprintf(stderr, "%s: %s holds %zu values, %zu expected\n", label, path, a.header.count, n);
        ++failures;
    } else {
        for (size_t i = 0; i < n; ++i) {
            num += ((double)a.data[i] - want[i]) * ((double)a.data[i] - want[i]);
            den += want[i] * want[i];
        }
        const double e = sqrt(num / den);
        if (!(e <= 2e-5)) {
            fprintf(stderr, "%s: %s: relative L2 %.3g against the float64 reference\n", label, path, e);
            ++failures;
        }
    }
    npy_free(&a);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: test_mpi_cli IHA IHA_MPI MPIEXEC WORKDIR\n");
        return 2;
    }
    const char *iha = argv[1], *iha_mpi = argv[2], *mpiexec = argv[3], *work = argv[4];
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/mpi_cli_layer", work);
    mkdir(work, 0700);
    mkdir(dir, 0700);
    static float x[B * N * D], wq[D * H * HD], wk[D * H * HD], wv[D * H * HD], wo[H * HD * D];
    static float aq[H * H * P], ak[H * H * P], av[H * H * P], r[H * H * P];
    unsigned state = 2024;
    const size_t sx[3] = {B, N, D}, sw[2] = {D, H * HD}, so[2] = {H * HD, D}, sm[3] = {H, H, P};
    const float ws = 1.0f / sqrtf((float)D);
    if (write_array(dir, "x", sx, 3, x, &state, 1.0f) || write_array(dir, "wq", sw, 2, wq, &state, ws) ||
        write_array(dir, "wk", sw, 2, wk, &state, ws) || write_array(dir, "wv", sw, 2, wv, &state, ws) ||
        write_array(dir, "wo", so, 2, wo, &state, ws) || write_array(dir, "alpha_q", sm, 3, aq, &state, 0.7f) ||
        write_array(dir, "alpha_k", sm, 3, ak, &state, 0.7f) || write_array(dir, "alpha_v", sm, 3, av, &state, 0.7f) ||
        write_array(dir, "r", sm, 3, r, &state, 0.7f))
        return 1;
    static const char *const masks[3] = {"causal", "token_causal", "none"};
    static const char *const layouts[] = {"contiguous", "zigzag"};
    static const int windows[2] = {0, 3};
    static double want[B * N * D];
    for (int m = 0; m < 3; ++m)
        for (int w = 0; w < 2; ++w) {
            ref_problem p = {.B = B,
                             .N = N,
                             .D = D,
                             .H = H,
                             .d = HD,
                             .P = P,
                             .mask = m,
                             .window = windows[w],
                             .rope = 1,
                             .rope_base = 500.0,
                             .x = x,
                             .wq = wq,
                             .wk = wk,
                             .wv = wv,
                             .wo = wo,
                             .alpha_q = aq,
                             .alpha_k = ak,
                             .alpha_v = av,
                             .r = r};
            if (ref_forward(&p, NULL, 0, want)) {
                fprintf(stderr, "the reference failed\n");
                return 1;
            }
            char opts[256], line[4096], out[1200], label[600];
            snprintf(opts, sizeof opts, "--mask %s --window %d --rope-base 500", masks[m], windows[w]);
            snprintf(out, sizeof out, "%s/z_one.npy", work);
            remove(out);
            snprintf(line, sizeof line, "'%s' forward --in '%s' --out '%s' %s > /dev/null", iha, dir, out, opts);
            snprintf(label, sizeof label, "iha forward %s", opts);
            if (run(line) == 0) compare(out, want, label);
            for (int ranks = 2; ranks <= 3; ++ranks)
                for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; ++l) {
                    snprintf(out, sizeof out, "%s/z_mpi.npy", work);
                    remove(out); /* a run that writes nothing must not pass on an earlier run's file */
                    snprintf(line, sizeof line,
                             "'%s' --oversubscribe --allow-run-as-root -n %d '%s' forward --in '%s' --out '%s' %s "
                             "--layout %s > /dev/null",
                             mpiexec, ranks, iha_mpi, dir, out, opts, layouts[l]);
                    snprintf(label, sizeof label, "iha-mpi forward on %d ranks, %s --layout %s", ranks, opts,
                             layouts[l]);
                    if (run(line) == 0) compare(out, want, label);
                }
        }
    /* What the tool refuses: a packed batch, an unknown layout. */
    char line[4096], path[1200], out[1200];
    snprintf(out, sizeof out, "%s/z_refused.npy", work);
    snprintf(line, sizeof line,
             "'%s' --oversubscribe --allow-run-as-root -n 2 '%s' forward --in '%s' --out '%s' --layout spiral "
             "2> /dev/null",
             mpiexec, iha_mpi, dir, out);
    if (system(line) == 0) {
        fprintf(stderr, "an unknown layout was accepted\n");
        ++failures;
    }
    snprintf(path, sizeof path, "%s/seq_lens.npy", dir);
    const size_t sl[1] = {3};
    const float lens[3] = {9, 4, 5};
    char err[256];
    if (npy_write_f32(path, sl, 1, lens, err, sizeof err) == 0) {
        snprintf(line, sizeof line,
                 "'%s' --oversubscribe --allow-run-as-root -n 2 '%s' forward --in '%s' --out '%s' 2> /dev/null",
                 mpiexec, iha_mpi, dir, out);
        if (system(line) == 0) {
            fprintf(stderr, "a directory with seq_lens.npy was accepted\n");
            ++failures;
        }
        remove(path);
    }
    struct stat st;
    if (stat(out, &st) == 0) {
        fprintf(stderr, "a refused run wrote %s\n", out);
        ++failures;
    }
    printf("test_mpi_cli: %d failures\n", failures);
    return failures == 0 ? 0 : 1;
}
