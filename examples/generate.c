/* doc/guide.md's decoding example, built and run by the test suite: a layer's KV cache filled by
 * a 16-token prompt in one step, then 8 tokens generated one at a time (weights on the device). */
#include <iha.h>
#include <stdio.h>
#include <stdlib.h>

static cl_mem upload(iha_context *ctx, size_t n, float scale)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; ++i) h[i] = scale * ((float)rand() / RAND_MAX - 0.5f);
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *h, h, NULL);
    free(h);
    return m;
}

int main(void)
{
    const size_t D = 128, H = 4, d = 32, P = 4, max_tokens = 64, prompt = 16;
    iha_context *ctx;
    char why[512];
    if (iha_context_create(&ctx, NULL, why, sizeof why) != IHA_OK) return fprintf(stderr, "%s\n", why), 1;
    iha_layer_weights w = {{upload(ctx, D * H * d, 0.2f), 0}, {upload(ctx, D * H * d, 0.2f), 0},
                           {upload(ctx, D * H * d, 0.2f), 0}, {upload(ctx, D * H * d, 0.2f), 0},
                           {upload(ctx, H * H * P, 1.0f), 0}, {upload(ctx, H * H * P, 1.0f), 0},
                           {upload(ctx, H * H * P, 1.0f), 0}, {upload(ctx, H * H * P, 1.0f), 0}};
    iha_attention_options opt;
    iha_attention_options_init(&opt);
    opt.rope = 1; /* rotary at virtual positions n*P + p */

    iha_kv_cache *cache;
    const iha_shape cache_shape = {.batch = 1, .tokens = max_tokens, .heads = H, .head_dim = d, .pseudo = P};
    iha_status st = iha_kv_cache_create(ctx, &cache_shape, IHA_STORAGE_F16, &cache); /* half: half the bytes */
    cl_mem x = upload(ctx, prompt * D, 1.0f), z = upload(ctx, prompt * D, 0.0f);

    iha_shape step = {.batch = 1, .tokens = prompt, .model_dim = D, .heads = H, .head_dim = d, .pseudo = P};
    if (st == IHA_OK) st = iha_decode_step(ctx, cache, &step, &opt, &w, NULL, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    step.tokens = 1; /* then one token per step: x holds the next token's input, z gets its output */
    for (int i = 0; i < 8 && st == IHA_OK; ++i)
        st = iha_decode_step(ctx, cache, &step, &opt, &w, NULL, (iha_buffer){x, 0}, (iha_buffer){z, 0});
    if (st == IHA_OK) st = iha_context_finish(ctx);
    if (st != IHA_OK) fprintf(stderr, "%s: %s\n", iha_status_name(st), iha_context_message(ctx));
    else printf("%zu tokens cached, %zu bytes\n", iha_kv_cache_length(cache, 0), iha_kv_cache_bytes(cache));

    iha_kv_cache_free(cache);
    iha_buffer *all = &w.wq;
    for (int i = 0; i < 8; ++i) clReleaseMemObject(all[i].mem);
    clReleaseMemObject(x);
    clReleaseMemObject(z);
    iha_context_free(ctx);
    return st == IHA_OK ? 0 : 1;
}
