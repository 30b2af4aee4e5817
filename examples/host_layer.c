/* The README's example (the test suite runs it): one IHA layer on host memory. */
#include <iha.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    const size_t B = 1, N = 128, D = 256, H = 4, d = 64, P = 4, wn = D * H * d, an = H * H * P;
    iha_context *ctx;
    char why[512]; /* the reason when no context can be made */
    if (iha_context_create(&ctx, NULL, why, sizeof why) != IHA_OK) /* IHA_DEVICE picks a device */
        return fprintf(stderr, "no context: %s\n", why), 1;
    float *x = malloc(B * N * D * sizeof *x), *z = malloc(B * N * D * sizeof *z);
    float *w = malloc((4 * wn + 4 * an) * sizeof *w); /* W_Q W_K W_V W_O, then alpha_Q alpha_K alpha_V R */
    if (!x || !z || !w) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < B * N * D; ++i) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < 4 * wn + 4 * an; ++i) w[i] = ((float)rand() / RAND_MAX - 0.5f) * (i < 4 * wn ? 0.2f : 2.0f);

    iha_shape shape = {.batch = B, .tokens = N, .model_dim = D, .heads = H, .head_dim = d, .pseudo = P};
    iha_attention_options opt;
    iha_attention_options_init(&opt); /* causal, global, scale 1/sqrt(d) */
    opt.window = N / (2 * P * P);     /* the paper's sliding-window layer */
    const float *a = w + 4 * wn;
    iha_host_weights weights = {w, w + wn, w + 2 * wn, w + 3 * wn, a, a + an, a + 2 * an, a + 3 * an};

    iha_status st = iha_forward_host(ctx, &shape, &opt, &weights, x, z); /* blocks until z is ready */
    if (st != IHA_OK) fprintf(stderr, "%s: %s\n", iha_status_name(st), iha_context_message(ctx));
    else printf("z[0] = %f on %s\n", z[0], iha_context_device_name(ctx));
    free(x), free(z), free(w);
    iha_context_free(ctx);
    return st == IHA_OK ? 0 : 1;
}
