/* One IHA layer on the application's own OpenCL objects: the application makes the OpenCL
 * context, queue and buffers, and the iha context borrows them. All eight weights share one
 * buffer at offsets. B=1 sequence of N=128 tokens, D=256, H=4 heads of d=64, P=4. */
#include <iha.h>
#include <stdio.h>
#include <stdlib.h>

/* The first GPU of any platform, else the first device of any type (iha's own default). */
static cl_device_id pick_device(void)
{
    cl_platform_id platforms[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) return NULL;
    if (np > 16) np = 16;
    const cl_device_type types[2] = {CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ALL};
    for (int t = 0; t < 2; ++t)
        for (cl_uint p = 0; p < np; ++p) {
            cl_device_id device;
            if (clGetDeviceIDs(platforms[p], types[t], 1, &device, NULL) == CL_SUCCESS) return device;
        }
    return NULL;
}

static float uniform(float scale) { return scale * ((float)rand() / (float)RAND_MAX - 0.5f); }

int main(void)
{
    const size_t B = 1, N = 128, D = 256, H = 4, d = 64, P = 4;
    const size_t nx = B * N * D, wn = D * H * d, an = H * H * P, nw = 4 * wn + 4 * an;
    cl_device_id device = pick_device();
    if (!device) return fprintf(stderr, "no OpenCL device\n"), 1;
    cl_int err;
    cl_context cl_ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return fprintf(stderr, "clCreateContext: %d\n", (int)err), 1;
    cl_command_queue queue = clCreateCommandQueue(cl_ctx, device, 0, &err); /* in-order */
    if (err != CL_SUCCESS) return fprintf(stderr, "clCreateCommandQueue: %d\n", (int)err), 1;

    float *x = malloc(nx * sizeof *x), *z = malloc(nx * sizeof *z), *w = malloc(nw * sizeof *w);
    if (!x || !z || !w) return 1;
    for (size_t i = 0; i < nx; ++i) x[i] = uniform(1.0f);
    for (size_t i = 0; i < nw; ++i) w[i] = i < 4 * wn ? uniform(0.1f) : uniform(1.0f) + 0.5f;
    cl_mem xb = clCreateBuffer(cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nx * sizeof *x, x, &err);
    cl_mem wb = clCreateBuffer(cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nw * sizeof *w, w, &err);
    cl_mem zb = clCreateBuffer(cl_ctx, CL_MEM_WRITE_ONLY, nx * sizeof *z, NULL, &err);
    if (!xb || !wb || !zb) return fprintf(stderr, "clCreateBuffer failed\n"), 1;

    iha_context_options options;
    iha_context_options_init(&options);
    options.opencl_context = cl_ctx; /* borrowed: iha retains both and releases only its references */
    options.opencl_queue = queue;
    iha_context *ctx;
    char why[512];
    if (iha_context_create(&ctx, &options, why, sizeof why) != IHA_OK) return fprintf(stderr, "%s\n", why), 1;

    iha_shape shape = {.batch = B, .tokens = N, .model_dim = D, .heads = H, .head_dim = d, .pseudo = P};
    iha_attention_options opt;
    iha_attention_options_init(&opt); /* causal, global, scale 1/sqrt(d) */
    /* Offsets count elements (floats here), as in CLBlast. */
    iha_layer_weights weights = {{wb, 0}, {wb, wn}, {wb, 2 * wn}, {wb, 3 * wn}, /* W_Q, W_K, W_V, W_O */
                                 {wb, 4 * wn}, {wb, 4 * wn + an}, /* alpha_Q, alpha_K */
                                 {wb, 4 * wn + 2 * an}, {wb, 4 * wn + 3 * an}}; /* alpha_V, R */
    iha_status st = iha_forward(ctx, &shape, &opt, &weights, (iha_buffer){xb, 0}, (iha_buffer){zb, 0});
    /* The layer is enqueued on the application's in-order queue: a blocking read after it on the
     * same queue sees its result. */
    if (st == IHA_OK) err = clEnqueueReadBuffer(queue, zb, CL_TRUE, 0, nx * sizeof *z, z, 0, NULL, NULL);
    if (st != IHA_OK) fprintf(stderr, "%s: %s\n", iha_status_name(st), iha_context_message(ctx));
    else if (err != CL_SUCCESS) fprintf(stderr, "clEnqueueReadBuffer: %d\n", (int)err);
    else printf("z[0] = %f on %s\n", z[0], iha_context_device_name(ctx));

    iha_context_free(ctx); /* the application's OpenCL objects stay valid */
    clReleaseMemObject(xb), clReleaseMemObject(wb), clReleaseMemObject(zb);
    clReleaseCommandQueue(queue);
    clReleaseContext(cl_ctx);
    free(x), free(z), free(w);
    return st == IHA_OK && err == CL_SUCCESS ? 0 : 1;
}
