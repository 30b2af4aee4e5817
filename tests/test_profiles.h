/*
 * test_profiles.h - what the tuning tests share: reading and writing files, hand-written
 * tuning profiles that carry this device's key, and the kernel choices of the last call.
 * Include after <cmocka.h>, test_util.h and <cjson/cJSON.h>; link with cJSON.
 */
#ifndef IHA_TESTS_TEST_PROFILES_H
#define IHA_TESTS_TEST_PROFILES_H

#include <cjson/cJSON.h>

#include "iha.h"
#include "iha_tune.h"

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
/* The format_version the library writes (src/tune/profile.c); tests that read an older or a
 * newer one say so. */
#define TP_FORMAT_VERSION 2
/* An empty profile (format, TP_FORMAT_VERSION, tp_key, no entries): add to its "entries" array. */
cJSON *tp_profile_new(void);
/* The entries of the profile at path; fails the test unless each records a verification error
 * inside the float32 contract and, when `kernel` is not NULL, is that kernel's. */
int tp_count_verified(const char *path, const char *kernel);
/* Fails the test when an entry of the profile at path has config[param] == value. */
void tp_assert_no_entry_with(const char *path, const char *param, int value);
/* Copies every kernel file of the repository's cl/ (.cl and .clh: kernels include shared
 * headers) into dir, each prefixed with fault(name) when that is not NULL (a planted fault for
 * the tuner to reject). Fails the test on error. */
void tp_copy_kernels(const char *dir, const char *(*fault)(const char *name));
/* The shape test_tune.c and test_profile.c tune and call: T = 48 virtual tokens, d = 8. */
extern const iha_shape tp_small_shape;

/* dir/name of the group's directory into out[size]. */
void tp_path_in(char *out, size_t size, const char *name);
/* For a test on the shared device (skipped without one): tp_path_in, with no file there. */
void tp_fresh_path(char *out, size_t size, const char *name);
/* tp_fresh_path, then tp_open_with_profile on that path. */
iha_context *tp_open_fresh(char *path, size_t size, const char *name, int first_use);
int tp_file_exists(const char *path);
/* Adds an attention entry of the register-tile variant (variant 0, LOC_KEYS at its canonical
 * 32, TILE_RY and TILE_RX at 4) to a profile's "entries"; role "bucket" or "device_default"; cfg
 * holds ATT_ROWS, ATT_TILES, ATT_KB, ATT_VD and group. */
void tp_add_attention(cJSON *root, const char *role, long mask, long windowed, long T, long span, const long cfg[5]);
/* A context on the profile file `profile` whose kernels come from kernel_dir (NULL: the
 * embedded ones; a directory also turns the program cache off, so planted faults are compiled);
 * fails the test when it cannot be created. */
iha_context *tp_open_with_kernels(const char *profile, const char *kernel_dir);
/* A context on the profile file `profile`, tuning on first use when asked (budget 6 s); fails
 * the test when it cannot be created. */
iha_context *tp_open_with_profile(const char *profile, int first_use);
/* iha_attention on random inputs of `shape` and `options`, checked against the float64
 * reference within the float32 contract of doc/spec.md. */
void tp_check_attention(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options);
/* tp_check_attention of tp_small_shape, causal and global. */
void tp_check_small(iha_context *ctx);
/* Causal attention options with this window (0: global). */
iha_attention_options tp_causal(int64_t window);
/* A tiny budgeted tune of `kernels` for tp_small_shape (causal, global) into ctx's profile; at
 * most 4 results. */
void tp_tune_small(iha_context *ctx, unsigned kernels, double budget, iha_tune_result *results, size_t *count);

/* The last layer call's choice for `kernel` ("attention", "rows", "decode", "gemm"). */
iha_kernel_choice tp_choice_of(iha_context *ctx, const char *kernel);

/* CMocka group setup and teardown: the shared context (tu_ctx), then tp_dir and tp_key, the
 * key read back from a profile that a 1-second tuning of `shape` makes the library write. */
int tp_group_setup(const iha_shape *shape);
/* tp_group_setup of tp_small_shape, as a CMocka group setup. */
int tp_group_setup_small(void **state);
int tp_group_teardown(void **state);

#endif
