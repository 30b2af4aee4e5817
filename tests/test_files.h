/*
 * test_files.h - a temporary directory and small files for the tests of the iha tool
 * (test_npy.c, test_npy_write.c, test_cli.c), which link the tool's helpers but not the library.
 * Include after <cmocka.h>.
 */
#ifndef IHA_TESTS_TEST_FILES_H
#define IHA_TESTS_TEST_FILES_H

#include <stddef.h>

#include "common/npy.h"

/* The group's temporary directory, made by tf_make_dir. */
extern char tf_dir[256];

/* Makes tf_dir fresh under $TMPDIR (else /tmp), named `name`_XXXXXX. Returns 0, or -1. */
int tf_make_dir(const char *name);
/* CMocka group setup and teardown: tf_dir made (iha_test_XXXXXX), and removed, empty. */
int tf_group_setup(void **state);
int tf_group_teardown(void **state);
/* tf_dir/name into path[size]; fails the test when it does not fit. */
void tf_path(char *path, size_t size, const char *name);
/* Writes text to path (created or truncated); fails the test on any error. */
void tf_write_text(const char *path, const char *text);
/* Reads the .npy file at path into *out (npy_free it); fails the test with the reader's message. */
void tf_read_npy(const char *path, npy_array *out);
/* Fails the test unless path is a symbolic link whose text is target. */
void tf_expect_link(const char *path, const char *target);
/* Fails the test unless the message err mentions needle. */
void tf_expect_mentions(const char *err, const char *needle);

#endif /* IHA_TESTS_TEST_FILES_H */
