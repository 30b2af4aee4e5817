/*
 * npy_write.c - the atomic float32 .npy writer: only to a regular file or a new path, through
 * symlinks to their targets, keeping an existing file's mode and owner. See npy.h.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* open, fstat, fsync, getpid, readlink, fchown: the atomic rename */
#endif
#include "common/npy.h"
#include "common/npy_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const void *bytes, size_t n)
{
    const unsigned char *p = bytes;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The version-1.0 image of the header, padded with spaces so the data starts 64-byte aligned
 * (what NumPy writes). Returns its length, or 0 when the shape text does not fit. */
static size_t format_header(const size_t *shape, size_t ndim, unsigned char *buf, size_t buf_size)
{
    char shape_text[NPY_MAX_DIMS * 24 + 8];
    npy_format_shape(shape, ndim, shape_text, sizeof shape_text);
    char dict[sizeof shape_text + 64];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape_text);
    if (n < 0 || (size_t)n >= sizeof dict)
        return 0;
    size_t len = (size_t)n + 1; /* the final '\n' */
    size_t total = (10 + len + 63) / 64 * 64;
    if (total > buf_size || total - 10 > 0xffff)
        return 0;
    memcpy(buf, npy__magic, sizeof npy__magic);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (unsigned char)((total - 10) & 0xff);
    buf[9] = (unsigned char)((total - 10) >> 8);
    memcpy(buf + 10, dict, (size_t)n);
    memset(buf + 10 + n, ' ', total - 10 - (size_t)n - 1);
    buf[total - 1] = '\n';
    return total;
}

static int write_image(int fd, const size_t *shape, size_t ndim, size_t count, const float *data)
{
    unsigned char header[NPY_MAX_DIMS * 24 + 192];
    size_t header_len = format_header(shape, ndim, header, sizeof header);
    if (!header_len || write_all(fd, header, header_len))
        return -1;
    unsigned char chunk[1 << 16];
    for (size_t done = 0; done < count;) {
        size_t n = count - done < sizeof chunk / 4 ? count - done : sizeof chunk / 4;
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &data[done + i], sizeof u);
            for (int k = 0; k < 4; k++)
                chunk[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        if (write_all(fd, chunk, 4 * n))
            return -1;
        done += n;
    }
    return fsync(fd);
}

/* ---- Where a written file lands -------------------------------------------------------- */

/* The file a symbolic link at `link` names: its target as it is when absolute, else taken
 * from the link's directory. Returns a malloc'd path or NULL with a message. */
static char *link_target(const char *link, const struct stat *st, char *err, size_t err_size)
{
    /* st_size is the target's length on most file systems and 0 on some (procfs): grow until
     * readlink leaves room to spare, which means it did not truncate. */
    size_t size = (size_t)st->st_size + 1 > 256 ? (size_t)st->st_size + 1 : 256;
    char *target = NULL;
    for (;;) {
        char *bigger = realloc(target, size);
        if (!bigger) {
            free(target);
            npy__fail(err, err_size, "out of memory");
            return NULL;
        }
        target = bigger;
        ssize_t n = readlink(link, target, size);
        if (n < 0) {
            npy__fail(err, err_size, "cannot read the symbolic link %s: %s", link, strerror(errno));
            free(target);
            return NULL;
        }
        if ((size_t)n < size) {
            target[n] = '\0';
            break;
        }
        size *= 2;
    }
    const char *slash = strrchr(link, '/');
    if (target[0] == '/' || !slash)
        return target;
    size_t dir_len = (size_t)(slash - link) + 1, target_len = strlen(target);
    char *joined = malloc(dir_len + target_len + 1);
    if (!joined) {
        npy__fail(err, err_size, "out of memory");
    } else {
        memcpy(joined, link, dir_len);
        memcpy(joined + dir_len, target, target_len + 1);
    }
    free(target);
    return joined;
}

/* Follows symbolic links from `path` to the file a write lands on, as open() would, and
 * refuses it unless it is a regular file or does not exist yet (a dangling link names the file
 * to create). Returns a malloc'd path; *exists and *st describe that file. NULL with a message
 * on failure. */
static char *resolve_output(const char *path, struct stat *st, int *exists, char *err, size_t err_size)
{
    enum { MAX_LINKS = 40 }; /* Linux's limit on links followed in one lookup */
    size_t len = strlen(path);
    char *current = malloc(len + 1);
    if (!current) {
        npy__fail(err, err_size, "out of memory");
        return NULL;
    }
    memcpy(current, path, len + 1);
    for (int links = 0;; links++) {
        if (lstat(current, st) != 0) {
            if (errno == ENOENT) {
                *exists = 0;
                return current;
            }
            npy__fail(err, err_size, "cannot examine %s: %s", current, strerror(errno));
            break;
        }
        if (!S_ISLNK(st->st_mode)) {
            *exists = 1;
            if (S_ISREG(st->st_mode))
                return current;
            npy__fail(err, err_size, "%s is %s: a .npy file is written only to a regular file or a new path",
                 current, npy__file_kind(st->st_mode));
            break;
        }
        if (links == MAX_LINKS) {
            npy__fail(err, err_size, "%s: more than %d levels of symbolic links", path, MAX_LINKS);
            break;
        }
        char *next = link_target(current, st, err, err_size);
        free(current);
        if (!(current = next))
            return NULL;
    }
    free(current);
    return NULL;
}

int npy_check_output(const char *path, char *err, size_t err_size)
{
    if (!path || !*path)
        return npy__fail(err, err_size, "no output path");
    struct stat st;
    int exists = 0;
    char *target = resolve_output(path, &st, &exists, err, err_size);
    if (!target)
        return -1;
    char *slash = strrchr(target, '/');
    const char *dir = slash == target ? "/" : slash ? target : ".";
    if (slash && slash != target)
        *slash = '\0';
    int rc = 0;
    if (access(dir, W_OK | X_OK) != 0)
        rc = npy__fail(err, err_size, "cannot write into directory '%s': %s", dir, strerror(errno));
    free(target);
    return rc;
}

/* Gives the temporary file the owner and permissions of the file it replaces, as a write in
 * place would have kept them. Only root may give a file away: for anyone else the change of
 * owner fails with EPERM, and the file is theirs, as a new file would be. */
static int keep_attributes(int fd, const struct stat *old)
{
    if ((old->st_uid != geteuid() || old->st_gid != getegid()) && fchown(fd, old->st_uid, old->st_gid) != 0 &&
        errno != EPERM)
        return -1;
    /* After the change of owner, which clears set-user-ID and set-group-ID bits. */
    return fchmod(fd, old->st_mode & 07777);
}

int npy_write_f32(const char *path, const size_t *shape, size_t ndim, const float *data, char *err,
                  size_t err_size)
{
    if (!path || (ndim && !shape) || ndim > NPY_MAX_DIMS)
        return npy__fail(err, err_size, "invalid arguments to the .npy writer");
    npy_header h = {.ndim = ndim, .dtype = NPY_F32};
    for (size_t i = 0; i < ndim; i++)
        h.shape[i] = shape[i];
    size_t count = 0;
    if (npy__element_count(&h, &count, err, err_size))
        return -1;
    if (count && !data)
        return npy__fail(err, err_size, "no data to write");
    struct stat old;
    int exists = 0;
    char *target = resolve_output(path, &old, &exists, err, err_size);
    if (!target)
        return -1;
    size_t tmp_size = strlen(target) + 32;
    char *tmp = malloc(tmp_size);
    if (!tmp) {
        free(target);
        return npy__fail(err, err_size, "out of memory");
    }
    /* Beside the target, so that the rename stays in one file system and one directory. A
     * replacement starts private and gets the old file's mode before any data is written. */
    snprintf(tmp, tmp_size, "%s.tmp.%ld", target, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, exists ? 0600 : 0666);
    int rc = -1;
    if (fd < 0) {
        npy__fail(err, err_size, "cannot create a temporary file beside %s: %s", target, strerror(errno));
        goto done;
    }
    rc = exists ? keep_attributes(fd, &old) : 0;
    if (rc == 0)
        rc = write_image(fd, shape, ndim, count, data);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        saved = errno;
    }
    if (rc == 0 && rename(tmp, target) != 0) {
        rc = -1;
        saved = errno;
    }
    if (rc != 0) {
        unlink(tmp);
        npy__fail(err, err_size, "cannot write %s: %s", target, strerror(saved));
    }
done:
    free(tmp);
    free(target);
    return rc;
}
