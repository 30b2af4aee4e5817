// A C++20 application of iha, built by CI's package stage with -Wall -Wextra -pedantic -Werror
// against an installed iha (find_package and pkg-config) and as a subproject. It asks for
// OpenCL 3.0 declarations itself, which iha.h must accept. Runs one small layer on host memory
// and checks that the library it runs with is the one it was compiled against.
#define CL_TARGET_OPENCL_VERSION 300
#include <iha.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

int main()
{
    if (iha_version_number() != IHA_VERSION_NUMBER || std::string(iha_version_string()) != IHA_VERSION_STRING) {
        std::fprintf(stderr, "compiled against iha %s, running with %s\n", IHA_VERSION_STRING, iha_version_string());
        return 1;
    }
    const std::size_t B = 1, N = 16, D = 32, H = 2, d = 16, P = 2;
    iha_context_options context_options;
    iha_context_options_init(&context_options);
    iha_context *ctx = nullptr;
    char why[512];
    if (iha_context_create(&ctx, &context_options, why, sizeof why) != IHA_OK) {
        std::fprintf(stderr, "no context: %s\n", why);
        return 1;
    }
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
    std::vector<float> x(B * N * D), z(B * N * D), w(4 * D * H * d), mix(4 * H * H * P);
    for (float &v : x) v = uniform(rng);
    for (float &v : w) v = 0.1f * uniform(rng);
    for (float &v : mix) v = 0.5f + uniform(rng);

    const iha_shape shape{.batch = B, .tokens = N, .model_dim = D, .heads = H, .head_dim = d, .pseudo = P};
    iha_attention_options options;
    iha_attention_options_init(&options);
    const std::size_t wn = D * H * d, an = H * H * P;
    const iha_host_weights weights{w.data(),   w.data() + wn,       w.data() + 2 * wn,  w.data() + 3 * wn,
                                   mix.data(), mix.data() + an, mix.data() + 2 * an, mix.data() + 3 * an};
    const iha_status st = iha_forward_host(ctx, &shape, &options, &weights, x.data(), z.data());
    bool finite = true;
    for (float v : z) finite = finite && std::isfinite(v);
    if (st != IHA_OK) std::fprintf(stderr, "%s: %s\n", iha_status_name(st), iha_context_message(ctx));
    else std::printf("iha %s from C++: z[0] = %f on %s\n", iha_version_string(), z[0], iha_context_device_name(ctx));
    iha_context_free(ctx);
    return st == IHA_OK && finite ? 0 : 1;
}
