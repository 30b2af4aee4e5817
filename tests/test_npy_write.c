/*
 * test_npy_write.c - the .npy writer of the iha tool (tools/common/npy_write.c): what it writes
 * reads back the same, it refuses FIFOs, directories and devices, follows symbolic links to
 * their target, and keeps the mode and owner of the file it replaces.
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, mkfifo, mknod, symlink, S_IFCHR */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/npy.h"
#include "test_files.h"

static const size_t small_shape[1] = {3};
static const float small_values[3] = {1.0f, -2.0f, 0.5f};

/* The file at path holds small_values as a .npy file. */
static void expect_small_file(const char *path)
{
    npy_array a;
    tf_read_npy(path, &a);
    assert_int_equal(a.header.count, 3);
    assert_memory_equal(a.data, small_values, sizeof small_values);
    npy_free(&a);
}

/* Both the output check and the writer refuse path, saying `why`. */
static void expect_output_refused(const char *path, const char *why)
{
    char err[256] = "";
    assert_int_equal(npy_check_output(path, err, sizeof err), -1);
    tf_expect_mentions(err, why);
    err[0] = '\0';
    assert_int_equal(npy_write_f32(path, small_shape, 1, small_values, err, sizeof err), -1);
    tf_expect_mentions(err, why);
}

static void writer_round_trip(void **state)
{
    (void)state;
    const size_t shape[3] = {2, 1, 3};
    const float values[6] = {1, 2, 3, -4, 5e-8f, 6e30f};
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/out.npy", tf_dir);
    assert_int_equal(npy_write_f32(path, shape, 3, values, err, sizeof err), 0);
    npy_array a;
    assert_int_equal(npy_read(path, &a, err, sizeof err), 0);
    assert_int_equal(a.header.ndim, 3);
    assert_int_equal(a.header.data_offset % 64, 0); /* NumPy's alignment */
    assert_memory_equal(a.header.shape, shape, sizeof shape);
    assert_memory_equal(a.data, values, sizeof values);
    npy_free(&a);
    unlink(path);
}

static void write_refuses_fifo_and_directory(void **state)
{
    (void)state;
    char fifo[512], dir[512];
    struct stat st;
    tf_path(fifo, sizeof fifo, "out_fifo.npy");
    tf_path(dir, sizeof dir, "out_dir.npy");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    expect_output_refused(fifo, "is a FIFO");
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    expect_output_refused(dir, "is a directory");
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* A device node of our own in the temporary directory (a twin of /dev/null, 1:3), never one of
 * /dev: a writer that replaced it would replace only the twin. Needs root and CAP_MKNOD. */
static void write_refuses_device_node(void **state)
{
    (void)state;
    char path[512], err[256] = "";
    tf_path(path, sizeof path, "out_device.npy");
    if (geteuid() != 0 || mknod(path, S_IFCHR | 0600, makedev(1, 3)) != 0) {
        print_message("skipped: creating a device node needs root (and CAP_MKNOD)\n");
        skip();
    }
    int rc = npy_write_f32(path, small_shape, 1, small_values, err, sizeof err);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rc, -1);
    tf_expect_mentions(err, "is a character device");
    assert_true(S_ISCHR(st.st_mode));
    assert_true(st.st_rdev == makedev(1, 3));
}

/* As numpy.save, which opens the path: the link stays and its target gets the data, through
 * chains of links and dangling links (which name the file to create). */
static void write_through_symlinks(void **state)
{
    (void)state;
    char real[512], link[512], chain[512], dangling[512], made[512], err[256] = "";
    tf_path(real, sizeof real, "real.npy");
    tf_path(link, sizeof link, "link.npy");
    tf_path(chain, sizeof chain, "chain.npy");
    tf_path(dangling, sizeof dangling, "dangling.npy");
    tf_path(made, sizeof made, "made.npy");
    tf_write_text(real, "old content");
    assert_int_equal(symlink("real.npy", link), 0);
    assert_int_equal(symlink(link, chain), 0); /* absolute, to a link */
    assert_int_equal(symlink("made.npy", dangling), 0);
    assert_int_equal(npy_check_output(chain, err, sizeof err), 0);
    const char *links[3] = {link, chain, dangling};
    for (int i = 0; i < 3; i++)
        if (npy_write_f32(links[i], small_shape, 1, small_values, err, sizeof err))
            fail_msg("npy_write_f32 %s: %s", links[i], err);
    tf_expect_link(link, "real.npy");
    tf_expect_link(chain, link);
    tf_expect_link(dangling, "made.npy");
    expect_small_file(real);
    expect_small_file(made);
    const char *all[5] = {real, link, chain, dangling, made};
    for (int i = 0; i < 5; i++)
        assert_int_equal(unlink(all[i]), 0);
}

/* A replaced file keeps its permissions, and as root its owner: a write in place would. The
 * modes have bits that a new file (0666 less the umask) never gets. */
static void write_keeps_mode_and_owner(void **state)
{
    (void)state;
    static const mode_t modes[3] = {0600, 0750, 0604};
    char path[512], err[256] = "";
    struct stat st;
    tf_path(path, sizeof path, "mode.npy");
    for (int i = 0; i < 3; i++) {
        tf_write_text(path, "old content");
        assert_int_equal(chmod(path, modes[i]), 0);
        const int as_root = geteuid() == 0;
        if (as_root)
            assert_int_equal(chown(path, 4321, 4322), 0);
        if (npy_write_f32(path, small_shape, 1, small_values, err, sizeof err))
            fail_msg("npy_write_f32: %s", err);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 07777, modes[i]);
        if (as_root) {
            assert_int_equal(st.st_uid, 4321);
            assert_int_equal(st.st_gid, 4322);
        }
        expect_small_file(path);
    }
    assert_int_equal(unlink(path), 0);
    /* A new file is created as open(2) would, which a later replacement keeps. */
    assert_int_equal(npy_write_f32(path, small_shape, 1, small_values, err, sizeof err), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(unlink(path), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(writer_round_trip),
        cmocka_unit_test(write_refuses_fifo_and_directory),
        cmocka_unit_test(write_refuses_device_node),
        cmocka_unit_test(write_through_symlinks),
        cmocka_unit_test(write_keeps_mode_and_owner),
    };
    return cmocka_run_group_tests(tests, tf_group_setup, tf_group_teardown);
}
