/*
 * test_files.c - the temporary directory and files of test_files.h.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_files.h"

char tf_dir[256];

int tf_make_dir(const char *name)
{
    const char *base = getenv("TMPDIR");
    snprintf(tf_dir, sizeof tf_dir, "%s/%s_XXXXXX", base && *base ? base : "/tmp", name);
    return mkdtemp(tf_dir) ? 0 : -1;
}

int tf_group_setup(void **state)
{
    (void)state;
    return tf_make_dir("iha_test");
}

int tf_group_teardown(void **state)
{
    (void)state;
    return rmdir(tf_dir);
}

void tf_path(char *path, size_t size, const char *name)
{
    int n = snprintf(path, size, "%s/%s", tf_dir, name);
    assert_true(n > 0 && (size_t)n < size);
}

void tf_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

void tf_expect_mentions(const char *err, const char *needle)
{
    if (!strstr(err, needle))
        fail_msg("message '%s' does not mention '%s'", err, needle);
}

void tf_read_npy(const char *path, npy_array *out)
{
    char err[256] = "";
    if (npy_read(path, out, err, sizeof err))
        fail_msg("npy_read %s: %s", path, err);
}

void tf_expect_link(const char *path, const char *target)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    char text[4096];
    const ssize_t n = readlink(path, text, sizeof text - 1);
    assert_int_equal(n, strlen(target));
    text[n] = '\0';
    assert_string_equal(text, target);
}
