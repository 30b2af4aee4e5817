/*
 * test_profiles.h - what the tuning tests share: reading and writing files, hand-written
 * tuning profiles that carry this device's key, and the kernel choices of the last call.
 * Include after <cmocka.h>, test_util.h and <cjson/cJSON.h>; link with cJSON.
 */
#ifndef IHA_TESTS_TEST_PROFILES_H
#define IHA_TESTS_TEST_PROFILES_H

#include <cjson/cJSON.h>

#include "iha.h"

/* The group's temporary directory and the key the library writes for this device. */
extern char tp_dir[1024];
extern cJSON *tp_key;

/* A file's bytes, NUL-terminated (free them); NULL when it cannot be opened. */
char *tp_slurp(const char *path);
/* Writes n bytes to path; fails the test on error. */
void tp_write_text(const char *path, const char *text, size_t n);
/* The JSON in a file; fails the test when it cannot be read or parsed. */
cJSON *tp_parse_file(const char *path);
void tp_write_json(cJSON *root, const char *path);
/* An empty profile (format, version, tp_key, no entries): add to its "entries" array. */
cJSON *tp_profile_new(void);
/* Fails the test when an entry of the profile at path has config[param] == value. */
void tp_assert_no_entry_with(const char *path, const char *param, int value);
/* Copies every kernel file of the repository's cl/ (.cl and .clh: kernels include shared
 * headers) into dir, each prefixed with fault(name) when that is not NULL (a planted fault for
 * the tuner to reject). Fails the test on error. */
void tp_copy_kernels(const char *dir, const char *(*fault)(const char *name));
/* The last layer call's choice for `kernel` ("attention", "rows", "decode", "gemm"). */
iha_kernel_choice tp_choice_of(iha_context *ctx, const char *kernel);

/* CMocka group setup and teardown: the shared context (tu_ctx), then tp_dir and tp_key, the
 * key read back from a profile that a 1-second tuning of `shape` makes the library write. */
int tp_group_setup(const iha_shape *shape);
int tp_group_teardown(void **state);

#endif
