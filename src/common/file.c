/* Reading files that the library does not control: see file.h. */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *iha__file_error(int code)
{
    return code == IHA_FILE_NOT_REGULAR ? "not a regular file" : strerror(code);
}

int iha__file_open_read(const char *path, int flags, int *fd)
{
    int oflags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | ((flags & IHA_FILE_NO_FOLLOW) ? O_NOFOLLOW : 0);
    int f = open(path, oflags);
    if (f < 0) return (errno == ELOOP && (flags & IHA_FILE_NO_FOLLOW)) ? IHA_FILE_NOT_REGULAR : errno;
    struct stat st;
    int code = 0;
    if (fstat(f, &st) != 0) code = errno;
    else if (S_ISDIR(st.st_mode)) code = EISDIR;
    else if (!S_ISREG(st.st_mode)) code = IHA_FILE_NOT_REGULAR;
    if (code != 0) {
        close(f);
        return code;
    }
    *fd = f;
    return 0;
}

int iha__file_read(const char *path, size_t limit, int flags, char **text, size_t *length)
{
    int fd = -1;
    int code = iha__file_open_read(path, flags, &fd);
    if (code != 0) return code;
    struct stat st;
    if (fstat(fd, &st) != 0) code = errno;
    /* The size fstat reports is a first guess: the file may grow or shrink while it is read. */
    size_t capacity = code == 0 && st.st_size > 0 && (size_t)st.st_size <= limit ? (size_t)st.st_size + 1 : 4096;
    char *buf = code == 0 ? malloc(capacity) : NULL;
    size_t used = 0;
    if (code == 0 && buf == NULL) code = ENOMEM;
    while (code == 0) {
        if (used + 1 == capacity) {
            if (capacity >= limit + 2) { /* one byte past the limit has been read */
                code = EFBIG;
                break;
            }
            size_t grown = capacity * 2 > limit + 2 ? limit + 2 : capacity * 2;
            char *p = realloc(buf, grown);
            if (p == NULL) {
                code = ENOMEM;
                break;
            }
            buf = p;
            capacity = grown;
        }
        ssize_t n = read(fd, buf + used, capacity - 1 - used);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) code = errno;
        else if (n == 0) break;
        else used += (size_t)n;
    }
    if (code == 0 && used > limit) code = EFBIG;
    close(fd);
    if (code != 0) {
        free(buf);
        return code;
    }
    buf[used] = '\0';
    *text = buf;
    *length = used;
    return 0;
}

char *iha__read_file(const char *path, size_t limit, size_t *length)
{
    char *text = NULL;
    int code = iha__file_read(path, limit, 0, &text, length);
    if (code != 0) errno = code == IHA_FILE_NOT_REGULAR ? EINVAL : code;
    return code == 0 ? text : NULL;
}
