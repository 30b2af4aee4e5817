/*
 * test_check.c - iha_check as an embedding application calls it: its refusals, rows into an
 * array shorter than the check and through the callback, and a context left as it was found
 * (iha_context_last_choices). That the check fails on a faulty kernel is cli_check_fault's
 * part (check_fault.cmake).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "test_util.h"

static void refusals(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_check_summary summary;
    iha_check_row row;
    iha_check_options o;
    iha_check_options_init(&o);
    assert_int_equal(iha_check(NULL, &o, &row, 1, &summary), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, &row, 1, NULL), IHA_ERROR_INVALID_ARGUMENT);
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, NULL, 1, &summary), IHA_ERROR_INVALID_ARGUMENT);
    o.families = 256u; /* no family's bit */
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, &row, 1, &summary), IHA_ERROR_INVALID_ARGUMENT);
}

typedef struct seen {
    size_t rows;
    char first_family[24];
} seen;

static void on_row(const iha_check_row *row, void *user)
{
    seen *s = user;
    if (s->rows++ == 0) strcpy(s->first_family, row->family);
}

/* The GEMM family: the library's kernel, and CLBlast where it is the backend. */
static void gemm_rows(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_check_options o;
    iha_check_options_init(&o);
    o.families = IHA_CHECK_GEMM;
    seen s = {0, ""};
    o.row = on_row, o.user = &s;
    iha_check_summary summary;
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, NULL, 0, &summary), IHA_OK);
    assert_true(summary.rows >= 1);
    assert_int_equal(s.rows, summary.rows);
    assert_string_equal(s.first_family, "gemm");
    assert_int_equal(summary.failed, 0);

    iha_check_row rows[4];
    memset(rows, 0, sizeof rows);
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, rows, 1, &summary), IHA_OK);
    assert_int_equal(rows[1].family[0], '\0'); /* nothing past capacity */
    assert_string_equal(rows[0].family, "gemm");
    assert_int_equal(rows[0].state, IHA_CHECK_OK);
    assert_true(rows[0].error >= 0.0 && rows[0].error <= rows[0].limit);
    assert_true(rows[0].limit == 1e-5);
    assert_true(strstr(rows[0].config, "backend=1") != NULL);
    assert_true(summary.seconds > 0.0);
}

/* The backward family's layer calls are not the application's last call. */
static void leaves_the_context(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    iha_kernel_choice before[4], after[4];
    size_t n_before = 0, n_after = 0;
    assert_int_equal(iha_context_last_choices(tu_ctx, before, 4, &n_before), IHA_OK);
    iha_check_options o;
    iha_check_options_init(&o);
    o.families = IHA_CHECK_BACKWARD;
    iha_check_row rows[8];
    iha_check_summary summary;
    tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, rows, 8, &summary), IHA_OK);
    assert_int_equal(summary.failed, 0);
    assert_int_equal(summary.rows, 3); /* two attention backward shapes and the layer */
    assert_string_equal(rows[2].family, "layer");
    assert_int_equal(iha_context_last_choices(tu_ctx, after, 4, &n_after), IHA_OK);
    assert_int_equal(n_after, n_before);
    for (size_t i = 0; i < n_before && i < 4; ++i) assert_memory_equal(&before[i], &after[i], sizeof before[i]);
}

/* The 16-bit families: the attention backward at both shapes and the layer, within their
 * storage's limit, each row named for its storage. */
static void sixteen_bit_families(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    static const struct {
        unsigned family;
        const char *name;
        double limit;
    } families[] = {{IHA_CHECK_HALF, "half", 2e-3}, {IHA_CHECK_BF16, "bf16", 1e-2}};
    for (size_t f = 0; f < 2; ++f) {
        iha_check_options o;
        iha_check_options_init(&o);
        o.families = families[f].family;
        iha_check_row rows[8];
        iha_check_summary summary;
        tu_assert_status(tu_ctx, iha_check(tu_ctx, &o, rows, 8, &summary), IHA_OK);
        assert_int_equal(summary.rows, 3);
        assert_int_equal(summary.failed, 0);
        for (size_t i = 0; i < 3; ++i) {
            assert_string_equal(rows[i].family, families[f].name);
            assert_int_equal(rows[i].state, IHA_CHECK_OK);
            assert_true(rows[i].limit == families[f].limit);
            assert_true(rows[i].error <= rows[i].limit);
        }
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(refusals),
        cmocka_unit_test(gemm_rows),
        cmocka_unit_test(leaves_the_context),
        cmocka_unit_test(sixteen_bit_families),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
