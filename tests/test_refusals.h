/*
 * test_refusals.h - what the refusal tests (test_errors.c, test_buffer_sizes.c) share: a valid
 * small layer on the device whose output holds only sentinels, and the check that a refused
 * call has a status, a message and left its output untouched. Include after <cmocka.h>,
 * test_util.h and test_layer.h.
 */
#ifndef IHA_TESTS_TEST_REFUSALS_H
#define IHA_TESTS_TEST_REFUSALS_H

#include <stddef.h>

#include "iha.h"
#include "test_layer.h"

/* The shape the refusals start from: B N D H d P = 1 5 8 2 4 2. */
extern const iha_shape tr_shape;

/* A valid small layer on the device (tu_ctx) whose z buffer holds only sentinels; tr_fixture_init
 * skips the test when there is no device. */
typedef struct tr_fixture {
    tu_layer layer;
    tu_device_layer dev;
    size_t z_total;     /* floats in dev.z.mem */
    iha_host_weights hw; /* the layer's host tensors */
    float *z;           /* a host output of nz floats, all TU_SENTINEL */
    size_t nz;
    cl_mem big, out;    /* TR_SPARE floats each, all TU_SENTINEL: stand-ins for inner tensors */
    iha_attention_options o; /* the options: tr_default_options() */
} tr_fixture;
#define TR_SPARE 400
void tr_fixture_init(tr_fixture *f, const iha_shape *shape, int offsets);
void tr_fixture_free(tr_fixture *f);

/* A buffer of n floats, all TU_SENTINEL. */
cl_mem tr_sentinel_buffer(size_t n);
iha_attention_options tr_default_options(void);
/* iha_forward of the fixture's tensors with this shape and these options. */
iha_status tr_run_forward(const tr_fixture *f, const iha_shape *shape, const iha_attention_options *o);

/* A refused call: status `expected`, a message, and the n floats of `out` all sentinels. */
void tr_assert_refused(iha_status got, iha_status expected, cl_mem out, size_t n);
/* Either of two statuses (where the header allows both readings), with the same checks. */
void tr_assert_refused_either(iha_status got, iha_status a, iha_status b, cl_mem out, size_t n);
/* Every one of the n host floats of z is still TU_SENTINEL, bit for bit. */
void tr_assert_host_untouched(const float *z, size_t n);

#endif /* IHA_TESTS_TEST_REFUSALS_H */
