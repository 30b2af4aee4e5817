/*
 * cmd_soak.c - "iha soak": layer calls in a loop for a bounded time, watching for resources
 * that grow: resident memory (VmRSS), open file descriptors and the OpenCL context's reference
 * count (on PoCL every buffer, program, kernel and queue holds one, so a leaked OpenCL object
 * shows there). After a warm-up, none of them may grow. Not a timed benchmark: it passes or
 * fails.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands/cli.h"
#include "common/layer_options.h"
#include "iha.h"
#include "common/random_layer.h"
#include "common/timer.h"

static cli_option options[] = {
    CLI_OPTION_DEVICE,
    {"seconds", "S", "length of the soak (default 60)", NULL},
    {"warmup", "S", "seconds before growth counts: caches and workspace fill up (default 10)", NULL},
    {"contexts", "MODE", "none: one context for all calls (default); borrowed: a new context per call on the "
                         "same OpenCL queue; owned: a new context, and OpenCL context, per call", NULL},
    {"max-growth-mib", "M", "resident memory growth allowed after the warm-up (default 4)", NULL},
    CLI_OPTION_TOKENS("tokens of the first shape; the second has N + N/4 (default 256)"),
    CLI_OPTION_HEAD_DIM("32"),
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "soak",
    "[options]",
    "Runs IHA layer calls in a loop for --seconds and samples, once a second, the process's\n"
    "resident memory, its open file descriptors and the OpenCL context's reference count. With\n"
    "--contexts none, the loop mixes what an application does: iha_forward on two shapes in turn,\n"
    "iha_forward_host (every 5th call), iha_backward (every 10th), iha_forward_save then\n"
    "iha_backward_saved (every 10th), a refused call (a too-small output) every 10th call,\n"
    "iha_context_trim every 25th, and checks that the first shape's output\n"
    "stays bit for bit the same; it samples at the same point of that cycle each time (just\n"
    "before a trim, when every kind of call has run since the last one), so that which buffers\n"
    "exist does not depend on when the second ticks. After the warm-up\n"
    "none of the three may grow: the lowest value of the last third of the samples must not\n"
    "exceed the lowest of the first third (memory by at most --max-growth-mib). Exit status:\n"
    "0 stable, 1 growth or a failed call, 2 usage.",
    options,
};

enum { CONTEXTS_NONE, CONTEXTS_BORROWED, CONTEXTS_OWNED };
static const char *const kContextModes[] = {"none", "borrowed", "owned", NULL};

typedef struct sample {
    double t, rss_mib;
    size_t calls, fds;
    unsigned refs;
} sample;

static double rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib / 1024.0;
}

static size_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    size_t n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n > 3 ? n - 3 : 0; /* ".", ".." and the directory's own descriptor */
}

static unsigned context_refs(cl_context cl)
{
    cl_uint n = 0;
    return clGetContextInfo(cl, CL_CONTEXT_REFERENCE_COUNT, sizeof n, &n, NULL) == CL_SUCCESS ? n : 0;
}

typedef struct soak {
    int mode;
    iha_context *ctx; /* the base context: owns the OpenCL objects the loop uses */
    random_layer layer[2];
    iha_attention_options options[2];
    float *first_z;   /* the first shape's output of the first call */
    random_layer_grads grads; /* iha_backward's outputs, sized for the larger shape */
    size_t calls;
} soak;

static int call_failed(iha_context *ctx, iha_status st, const char *what)
{
    if (st == IHA_OK)
        return 0;
    cli_error(&spec, "%s: %s: %s", what, iha_status_name(st), iha_context_message(ctx));
    return -1;
}

static iha_status forward_host(iha_context *ctx, random_layer *l, const iha_attention_options *o)
{
    const iha_host_weights w = random_layer_host_weights(l);
    return iha_forward_host(ctx, &l->shape, o, &w, l->x, l->z);
}

/* The first shape's device output, compared bit for bit with the first call's. */
static int check_output(soak *s)
{
    random_layer *l = &s->layer[0];
    char err[256];
    if (random_layer_read_output(s->ctx, l, err, sizeof err)) {
        cli_error(&spec, "%s", err);
        return -1;
    }
    const size_t n = l->shape.batch * l->shape.tokens * l->shape.model_dim;
    if (!s->first_z) {
        if (!(s->first_z = malloc(n * sizeof *s->first_z))) {
            cli_error(&spec, "out of memory");
            return -1;
        }
        memcpy(s->first_z, l->z, n * sizeof *l->z);
    } else if (memcmp(s->first_z, l->z, n * sizeof *l->z) != 0) {
        cli_error(&spec, "call %zu: the output differs from the first call's", s->calls);
        return -1;
    }
    return 0;
}

/* One step of the loop with one context for everything. */
static int step_shared(soak *s)
{
    iha_context *ctx = s->ctx;
    const size_t i = s->calls;
    random_layer *l = &s->layer[i % 2];
    if (i % 10 == 9) { /* refused: z is one float too small at this offset */
        const size_t nz = l->shape.batch * l->shape.tokens * l->shape.model_dim;
        iha_status st = iha_forward(ctx, &l->shape, &s->options[i % 2], &l->weights, (iha_buffer){l->x_mem, 0},
                                    (iha_buffer){l->z_mem, 1});
        if (st != IHA_ERROR_BUFFER_TOO_SMALL) {
            cli_error(&spec, "a call with z short by one float of %zu returned %s", nz, iha_status_name(st));
            return -1;
        }
        return 0;
    }
    if (i % 25 == 24)
        iha_context_trim(ctx);
    if (i % 5 == 3)
        return call_failed(ctx, forward_host(ctx, l, &s->options[i % 2]), "iha_forward_host");
    if (i % 10 == 1)
        return call_failed(ctx, random_layer_backward(ctx, l, &s->options[i % 2], &s->grads), "iha_backward");
    if (i % 10 == 6) /* the training pair: iha_forward_save, then iha_backward_saved from its state */
        return call_failed(ctx, random_layer_forward_save(ctx, l, &s->options[i % 2], &s->grads),
                           "iha_forward_save") ||
               call_failed(ctx, random_layer_backward_saved(ctx, l, &s->options[i % 2], &s->grads),
                           "iha_backward_saved");
    if (call_failed(ctx, random_layer_forward(ctx, l, &s->options[i % 2]), "iha_forward"))
        return -1;
    return i % 50 == 0 ? check_output(s) : 0;
}

/* One step with a context of its own: borrowing the base context's OpenCL objects (device
 * tensors), or owning new ones (host tensors). */
static int step_new_context(soak *s)
{
    iha_context_options o;
    iha_context_options_init(&o);
    if (s->mode == CONTEXTS_BORROWED) {
        o.opencl_context = iha_context_cl_context(s->ctx);
        o.opencl_queue = iha_context_cl_queue(s->ctx);
    }
    iha_context *ctx;
    if (cli_open_context(&spec, &o, &ctx)) return -1;
    random_layer *l = &s->layer[s->calls % 2];
    const iha_attention_options *ao = &s->options[s->calls % 2];
    const iha_status st = s->mode == CONTEXTS_BORROWED ? random_layer_forward(ctx, l, ao) : forward_host(ctx, l, ao);
    int rc = call_failed(ctx, st, "a layer call on a new context");
    iha_context_free(ctx);
    return rc;
}

static int setup(soak *s, size_t n, size_t d, char *err, size_t err_size)
{
    if (cli_open_context(&spec, NULL, &s->ctx))
        return -1;
    const iha_shape shapes[2] = {{1, n, 128, 4, d, 2}, {1, n + n / 4, 128, 4, d, 2}};
    for (int i = 0; i < 2; i++) {
        iha_attention_options_init(&s->options[i]);
        s->options[i].window = i ? (int64_t)(n / 8 + 1) : 0;
        s->options[i].rope = d % 2 == 0;
        if (random_layer_create(s->ctx, &shapes[i], 100 + (uint64_t)i, &s->layer[i], err, err_size))
            return -1;
    }
    return random_layer_grads_create(s->ctx, &shapes[1], &s->grads, err, err_size);
}

static void teardown(soak *s)
{
    for (int i = 0; i < 2; i++)
        random_layer_free(&s->layer[i]);
    random_layer_grads_free(&s->grads);
    free(s->first_z);
    iha_context_free(s->ctx);
}

/* Growth of a series after the warm-up: the smallest value of its last third minus the
 * smallest of its first third. A leak raises the floor; a sample that happens to catch a call's
 * temporaries (a few buffers, a page of the allocator) does not. */
static double growth(const sample *v, size_t from, size_t count, int field)
{
    double first = 1e300, last = 1e300;
    const size_t third = (count - from) / 3 ? (count - from) / 3 : 1;
    for (size_t i = from; i < count; i++) {
        const double x = field == 0 ? v[i].rss_mib : field == 1 ? (double)v[i].fds : (double)v[i].refs;
        if (i < from + third && x < first)
            first = x;
        if (i >= count - third && x < last)
            last = x;
    }
    return last - first;
}

int cmd_soak(int argc, char **argv)
{
    int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    size_t seconds = 60, warmup = 10, max_growth = 4, n = 256, d = 32;
    soak s;
    memset(&s, 0, sizeof s);
    if (cli_get_size(&spec, "seconds", 3, 7 * 24 * 3600, &seconds) || cli_get_size(&spec, "warmup", 0, 3600, &warmup) ||
        cli_get_size(&spec, "max-growth-mib", 0, 1 << 20, &max_growth) || cli_get_size(&spec, "n", 8, 1 << 16, &n) ||
        cli_get_size(&spec, "d", 1, CLI_MAX_HEAD_DIM, &d) || cli_get_choice(&spec, "contexts", kContextModes, &s.mode))
        return CLI_EXIT_USAGE;
    if (warmup + 3 > seconds) {
        cli_error(&spec, "--warmup must leave at least 3 s of the %zu s soak", seconds);
        return CLI_EXIT_USAGE;
    }
    char err[512] = "";
    sample *v = calloc(seconds + 2, sizeof *v);
    if (!v || setup(&s, n, d, err, sizeof err)) {
        if (!v || err[0]) /* cli_open_context has said why it failed */
            cli_error(&spec, "%s", v ? err : "out of memory");
        free(v);
        teardown(&s);
        return CLI_EXIT_FAILURE;
    }
    cl_context cl = iha_context_cl_context(s.ctx);
    printf("iha soak (library %s) on %s\n", iha_version_string(), iha_context_device_name(s.ctx));
    printf("  %zu s, warm-up %zu s, contexts %s, shapes B=1 N=%zu and %zu D=128 H=4 d=%zu P=2\n", seconds, warmup,
           kContextModes[s.mode], n, n + n / 4, d);
    printf("  %7s %8s %10s %5s %8s\n", "t(s)", "calls", "rss(MiB)", "fds", "cl_refs");
    const double start = timer_seconds();
    double next = 1.0;
    size_t count = 0, from = 0;
    int failed = 0;
    /* Samples wait for a point of the call cycle, so the wall time bounds the loop too: with
     * slow calls (a large --n, a slow device) fewer samples than seconds are taken. */
    while (!failed && count <= seconds && timer_seconds() - start < (double)seconds + 1.0) {
        failed = s.mode == CONTEXTS_NONE ? step_shared(&s) : step_new_context(&s);
        s.calls++;
        const double t = timer_seconds() - start;
        /* With one context, the first call after each second at which the workspace is always
         * in the same state: the last call before a trim (call 49 of every 50), when every kind
         * of call has run since the previous trim and each has its buffers. Sampled at any
         * call, the context's references depended on how many of the backward's buffers had
         * come back since the last trim, and a floor caught in the first third alone read as
         * growth (+15 references in one 30 s run); sampled just after a trim, the resident
         * memory depended on which freed buffers the allocator had returned. */
        if (t < next || (s.mode == CONTEXTS_NONE && s.calls % 50 != 49))
            continue;
        v[count] = (sample){t, rss_mib(), s.calls, open_fds(), context_refs(cl)};
        printf("  %7.1f %8zu %10.1f %5zu %8u\n", t, s.calls, v[count].rss_mib, v[count].fds, v[count].refs);
        fflush(stdout);
        if (t < (double)warmup)
            from = count + 1;
        count++;
        next = (double)(size_t)t + 1.0; /* a slow call (the first builds kernels) skips samples */
    }
    const double rss = growth(v, from, count, 0), fds = growth(v, from, count, 1), refs = growth(v, from, count, 2);
    const int stable = !failed && count > from && rss <= (double)max_growth && fds <= 0 && refs <= 0;
    if (!failed && count > from)
        printf("result: after the warm-up, %zu calls: resident memory %+.1f MiB (limit %zu), open files %+.0f, "
               "context references %+.0f: %s\n",
               s.calls, rss, max_growth, fds, refs, stable ? "stable" : "GROWING");
    free(v);
    teardown(&s);
    return stable ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}
