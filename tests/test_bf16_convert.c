/* The bfloat16 conversions (IHA_STORAGE_BF16): iha_bf16_from_float and iha_bf16_to_float bit
 * for bit (ties to even, NaN kept quiet, infinities, overflow, subnormals, all 65536 patterns),
 * and the device's loads and rounding stores (cl/bf16.clh) against them. tests/test_bf16.c
 * checks the calls that use them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "test_layer.h"

/* ---- Host conversions ---- */

static uint16_t to_bf16(float x)
{
    uint16_t b;
    iha_bf16_from_float(&x, &b, 1);
    return b;
}

static float from_bf16(uint16_t b)
{
    float f;
    iha_bf16_to_float(&b, &f, 1);
    return f;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void host_conversions(void **state)
{
    (void)state;
    assert_int_equal(to_bf16(0.0f), 0x0000);
    assert_int_equal(to_bf16(-0.0f), 0x8000);
    assert_int_equal(to_bf16(1.0f), 0x3f80);
    assert_int_equal(to_bf16(-2.0f), 0xc000);
    /* Ties to even: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7. */
    assert_int_equal(to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(to_bf16(1.0f + 0x3p-8f), 0x3f82); /* halfway, to the even neighbour above */
    assert_int_equal(to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_int_equal(to_bf16(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);
    assert_int_equal(to_bf16(-(1.0f + 0x3p-8f)), 0xbf82);
    /* Infinities stay, the largest bfloat16 stays, and past its midpoint to 2^128 is infinity. */
    assert_int_equal(to_bf16(INFINITY), 0x7f80);
    assert_int_equal(to_bf16(-INFINITY), 0xff80);
    assert_int_equal(to_bf16(from_bits(0x7f7f0000u)), 0x7f7f);
    assert_int_equal(to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(to_bf16(from_bits(0x7f7f8000u)), 0x7f80); /* the tie goes to even: infinity */
    assert_int_equal(to_bf16(-FLT_MAX), 0xff80);
    /* NaN stays a quiet NaN, its sign and upper payload kept; a signalling NaN whose payload
     * sits only in the dropped bits does not become infinity. */
    assert_int_equal(to_bf16(from_bits(0x7fc00000u)), 0x7fc0);
    assert_int_equal(to_bf16(from_bits(0xffc00000u)), 0xffc0);
    assert_int_equal(to_bf16(from_bits(0x7f800001u)), 0x7fc0);
    assert_int_equal(to_bf16(from_bits(0x7fffffffu)), 0x7fff);
    assert_int_equal(to_bf16(from_bits(0x7fa00000u)), 0x7fe0);
    assert_true(isnan(from_bf16(to_bf16(NAN))));
    /* Subnormals: the smallest, a tie between it and 0 (to even: 0), and rounding up into the
     * smallest normal. */
    assert_int_equal(to_bf16(0x1p-133f), 0x0001);
    assert_int_equal(to_bf16(0x1p-134f), 0x0000);
    assert_int_equal(to_bf16(0x3p-134f), 0x0002);
    assert_int_equal(to_bf16(from_bits(0x007fffffu)), 0x0080);
    assert_int_equal(to_bf16(-0x1p-133f), 0x8001);
    assert_true(from_bf16(0x0001) == 0x1p-133f);
    assert_true(from_bf16(0x3eab) == 0x1.56p-2f);
    /* Every pattern survives bfloat16 -> float -> bfloat16: NaNs come back NaN with the quiet
     * bit set, every other value exactly. */
    for (uint32_t b = 0; b < 0x10000u; ++b) {
        const float f = from_bf16((uint16_t)b);
        const uint16_t back = to_bf16(f);
        const int nan = (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
        if (nan ? back != (b | 0x40u) || !isnan(f) : back != b)
            fail_msg("bfloat16 0x%04x -> %a -> 0x%04x", b, (double)f, back);
    }
    iha_bf16_from_float(NULL, NULL, 0); /* n == 0 touches nothing */
    iha_bf16_to_float(NULL, NULL, 0);
}

/* ---- The device's conversions, bit for bit ---- */

/* iha_attention with zero queries and keys under IHA_MASK_NONE gives each row the mean of its
 * sequence's values exactly (every probability is exp2(0) = 1; the sum of two values must not
 * overflow): one value repeated returns it,
 * and two neighbouring bfloat16 values return their midpoint, which the device must round to
 * the even neighbour as the host does. 512 sequences of 2 tokens of d = 128 hold every
 * pattern. Subnormals may come back as zeros of their sign: OpenCL does not require float
 * denormals. A NaN must come back a NaN. */
static void device_conversions_bit_exact(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const iha_shape s = {512, 2, 1, 1, 128, 1};
    const size_t n = tu_count_virtual(&s), nl = s.batch * s.tokens;
    iha_attention_options o = tu_options(IHA_MASK_NONE, 0, 0);
    o.storage = IHA_STORAGE_BF16;
    uint16_t *v = tu_malloc(n * sizeof *v), *got = tu_malloc(n * sizeof *got), *zero = tu_malloc(n * sizeof *zero);
    memset(zero, 0, n * sizeof *zero);
    cl_int err;
    const cl_context cl = iha_context_cl_context(tu_ctx);
    cl_mem q = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 2, zero, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem vm = clCreateBuffer(cl, CL_MEM_READ_WRITE, n * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem om = clCreateBuffer(cl, CL_MEM_READ_WRITE, n * 2, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem lse = tu_buffer_new(tu_ctx, nl);
    const cl_command_queue queue = iha_context_cl_queue(tu_ctx);
    for (int pass = 0; pass < 2; ++pass) {
        /* Sequence b holds patterns 128 b .. 128 b + 127 at both tokens (pass 0), or at token 1
         * each pattern's upper neighbour (pass 1). */
        for (size_t b = 0; b < s.batch; ++b)
            for (size_t c = 0; c < s.head_dim; ++c) {
                const uint16_t a = (uint16_t)(b * s.head_dim + c);
                v[(b * 2) * s.head_dim + c] = a;
                v[(b * 2 + 1) * s.head_dim + c] = pass ? (uint16_t)(a + 1) : a;
            }
        assert_int_equal(clEnqueueWriteBuffer(queue, vm, CL_TRUE, 0, n * 2, v, 0, NULL, NULL), CL_SUCCESS);
        tu_assert_status(tu_ctx,
                         iha_attention(tu_ctx, &s, &o, (iha_buffer){q, 0}, (iha_buffer){q, 0}, (iha_buffer){vm, 0},
                                       (iha_buffer){om, 0}, (iha_buffer){lse, 0}),
                         IHA_OK);
        assert_int_equal(clEnqueueReadBuffer(queue, om, CL_TRUE, 0, n * 2, got, 0, NULL, NULL), CL_SUCCESS);
        size_t checked = 0;
        for (size_t b = 0; b < s.batch; ++b)
            for (size_t c = 0; c < s.head_dim; ++c) {
                const uint16_t a = (uint16_t)(b * s.head_dim + c);
                const int special = (a & 0x7f80u) == 0x7f80u, subnormal = (a & 0x7f80u) == 0 && (a & 0x7fu);
                /* The sum of two values of the largest exponent overflows float; pass 1 takes
                 * neighbours of one exponent, whose midpoint is exact in float. */
                if ((a & 0x7f80u) == 0x7f00u || (pass && (special || (a & 0x7fu) == 0x7fu))) continue;
                float mid = from_bf16(a);
                if (pass) mid = (mid + from_bf16((uint16_t)(a + 1))) * 0.5f;
                const uint16_t want = to_bf16(mid);
                for (size_t t = 0; t < 2; ++t) {
                    const uint16_t out = got[(b * 2 + t) * s.head_dim + c];
                    /* A NaN's payload, and a zero's sign (the sum starts at +0), are not kept. */
                    const int nan = special && (a & 0x7fu), out_nan = (out & 0x7f80u) == 0x7f80u && (out & 0x7fu);
                    const int zero = (want & 0x7fffu) == 0 && (out & 0x7fffu) == 0;
                    const int flushed = subnormal && (out & 0x7fffu) == 0 && (out & 0x8000u) == (a & 0x8000u);
                    if (nan ? !out_nan : out != want && !zero && !flushed)
                        fail_msg("pass %d: pattern 0x%04x, token %zu: the device stored 0x%04x, the host 0x%04x",
                                 pass, a, t, out, want);
                    ++checked;
                }
            }
        assert_true(checked > (pass ? 100000u : 130000u));
    }
    assert_int_equal(to_bf16(1.0f + 0x1p-8f), 0x3f80); /* a tie pass 1 meets: 1 and its neighbour */
    tu_buffer_release(q), tu_buffer_release(vm), tu_buffer_release(om), tu_buffer_release(lse);
    free(v), free(got), free(zero);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(host_conversions),
        cmocka_unit_test(device_conversions_bit_exact),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
