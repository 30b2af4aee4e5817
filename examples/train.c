/* doc/guide.md's training example, built and run by the test suite: an IHA layer fitted to a
 * random target by gradient descent, with iha_forward_save and iha_backward_saved on device
 * buffers (the forward keeps the attention's output in `saved`, so the backward does not run
 * it again; iha_backward without saved state is the same call with x alone).
 * Every parameter lives in one buffer (W_Q, W_K, W_V, W_O, alpha_Q, alpha_K, alpha_V, R at
 * offsets) and every gradient in a second one with the same layout. Exit status 0 when the
 * loss has fallen by a fifth or more. */
#include <iha.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        iha_status st_ = (call);                                                                       \
        if (st_ != IHA_OK) {                                                                           \
            fprintf(stderr, "%s: %s: %s\n", #call, iha_status_name(st_), iha_context_message(ctx));  \
            return 1;                                                                                  \
        }                                                                                              \
    } while (0)

static float uniform(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

static cl_mem buffer(iha_context *ctx, size_t n)
{
    cl_int err;
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
    return err == CL_SUCCESS ? m : NULL;
}

/* Blocking copies; nonzero (after a message) when OpenCL fails. */
static int upload(iha_context *ctx, cl_mem m, const float *src, size_t n)
{
    cl_int err = clEnqueueWriteBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), src, 0, NULL, NULL);
    if (err != CL_SUCCESS) fprintf(stderr, "clEnqueueWriteBuffer failed (%d)\n", (int)err);
    return err != CL_SUCCESS;
}

static int download(iha_context *ctx, cl_mem m, float *dst, size_t n)
{
    cl_int err = clEnqueueReadBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), dst, 0, NULL, NULL);
    if (err != CL_SUCCESS) fprintf(stderr, "clEnqueueReadBuffer failed (%d)\n", (int)err);
    return err != CL_SUCCESS;
}

static int train(iha_context *ctx)
{
    const size_t B = 2, N = 16, D = 32, H = 2, d = 16, P = 2;
    const size_t nx = B * N * D, nw = D * H * d, na = H * H * P, np = 4 * nw + 4 * na;
    const iha_shape shape = {.batch = B, .tokens = N, .model_dim = D, .heads = H, .head_dim = d, .pseudo = P};
    iha_attention_options opt;
    iha_attention_options_init(&opt); /* causal, global */
    opt.rope = 1;

    float *x = malloc(nx * sizeof *x), *target = malloc(nx * sizeof *target), *z = malloc(nx * sizeof *z);
    float *params = malloc(np * sizeof *params), *grads = malloc(np * sizeof *grads);
    if (!x || !target || !z || !params || !grads) return 1;
    for (size_t i = 0; i < nx; ++i) x[i] = uniform(), target[i] = uniform();
    for (size_t i = 0; i < np; ++i) params[i] = i < 4 * nw ? 0.3f * uniform() : 0.5f + uniform();

    size_t ns;
    CHECK(iha_saved_elements(ctx, &shape, &ns));
    cl_mem xb = buffer(ctx, nx), zb = buffer(ctx, nx), dzb = buffer(ctx, nx), pb = buffer(ctx, np), gb = buffer(ctx, np);
    cl_mem saved = buffer(ctx, ns);
    if (!xb || !zb || !dzb || !pb || !gb || !saved) return 1;
    if (upload(ctx, xb, x, nx)) return 1;
    /* The parameters and their gradients at the same offsets of two buffers. */
    iha_layer_weights w;
    iha_layer_grads g;
    iha_buffer *wp[8] = {&w.wq, &w.wk, &w.wv, &w.wo, &w.alpha_q, &w.alpha_k, &w.alpha_v, &w.r};
    iha_buffer *gp[8] = {&g.wq, &g.wk, &g.wv, &g.wo, &g.alpha_q, &g.alpha_k, &g.alpha_v, &g.r};
    for (size_t i = 0; i < 8; ++i) {
        const size_t at = i < 4 ? i * nw : 4 * nw + (i - 4) * na;
        *wp[i] = (iha_buffer){pb, at};
        *gp[i] = (iha_buffer){gb, at};
    }

    double first = 0.0, loss = 0.0;
    for (int step = 0; step < 25; ++step) {
        if (upload(ctx, pb, params, np)) return 1;
        CHECK(iha_forward_save(ctx, &shape, &opt, &w, (iha_buffer){xb, 0}, (iha_buffer){zb, 0}, (iha_buffer){saved, 0}));
        if (download(ctx, zb, z, nx)) return 1;
        loss = 0.0; /* 0.5 * |z - target|^2, whose gradient dLoss/dz is z - target */
        for (size_t i = 0; i < nx; ++i) {
            z[i] -= target[i];
            loss += 0.5 * z[i] * z[i];
        }
        if (step == 0) first = loss;
        if (upload(ctx, dzb, z, nx)) return 1;
        /* The same parameters and x as the forward that filled `saved`. dx is not needed (x is the
         * input data): NULL skips it. */
        CHECK(iha_backward_saved(ctx, &shape, &opt, &w, (iha_buffer){xb, 0}, (iha_buffer){saved, 0},
                                 (iha_buffer){dzb, 0}, (iha_buffer){NULL, 0}, &g));
        if (download(ctx, gb, grads, np)) return 1;
        /* A step that the first-order model says removes a tenth of the loss. */
        double norm2 = 0.0;
        for (size_t i = 0; i < np; ++i) norm2 += (double)grads[i] * grads[i];
        const float lr = norm2 > 0.0 ? (float)(0.1 * loss / norm2) : 0.0f;
        for (size_t i = 0; i < np; ++i) params[i] -= lr * grads[i];
        if (step % 5 == 0) printf("step %2d  loss %.5f\n", step, loss);
    }
    printf("loss %.5f -> %.5f on %s\n", first, loss, iha_context_device_name(ctx));
    clReleaseMemObject(xb), clReleaseMemObject(zb), clReleaseMemObject(dzb), clReleaseMemObject(pb), clReleaseMemObject(gb);
    clReleaseMemObject(saved);
    free(x), free(target), free(z), free(params), free(grads);
    return isfinite(loss) && loss < 0.8 * first ? 0 : 1;
}

int main(void)
{
    iha_context *ctx;
    char why[512];
    if (iha_context_create(&ctx, NULL, why, sizeof why) != IHA_OK) { /* IHA_DEVICE picks a device */
        fprintf(stderr, "no context: %s\n", why);
        return 1;
    }
    const int rc = train(ctx);
    iha_context_free(ctx);
    return rc;
}
