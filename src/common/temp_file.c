/* Whole-file replacement and the removal of dead writers' temporary files: see temp_file.h. */
#include "common/temp_file.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TEMP_TAG ".tmp."

static int write_all(int fd, const void *data, size_t length)
{
    const unsigned char *p = data;
    while (length > 0) {
        ssize_t n = write(fd, p, length);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        p += n;
        length -= (size_t)n;
    }
    return 0;
}

int iha__file_replace(const char *path, const iha_file_part *parts, size_t count, int sync)
{
    /* Unique per writer without global state: the pid, this frame's address (which differs
     * between threads running at the same time) and the clock. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    size_t n = strlen(path) + 80;
    char *tmp = malloc(n);
    if (tmp == NULL) return ENOMEM;
    snprintf(tmp, n, "%s" TEMP_TAG "%ld.%lx.%ld", path, (long)getpid(), (unsigned long)(uintptr_t)&now,
             (long)now.tv_nsec);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int code = fd < 0 ? errno : 0;
    /* The replacement keeps the mode of the file it replaces (a 0600 file stays 0600). */
    struct stat old;
    if (code == 0 && lstat(path, &old) == 0 && S_ISREG(old.st_mode) && fchmod(fd, old.st_mode & 07777) != 0)
        code = errno;
    for (size_t i = 0; code == 0 && i < count; ++i) code = write_all(fd, parts[i].data, parts[i].length);
    if (code == 0 && sync && fsync(fd) != 0) code = errno;
    if (fd >= 0 && close(fd) != 0 && code == 0) code = errno;
    if (code == 0 && rename(tmp, path) != 0) code = errno;
    if (code != 0 && fd >= 0) unlink(tmp);
    free(tmp);
    return code;
}

/* Digits of the base (10 or 16) from p; returns the end, or NULL when there is none. */
static const char *skip_digits(const char *p, int hex)
{
    const char *start = p;
    while (hex ? isxdigit((unsigned char)*p) : isdigit((unsigned char)*p)) ++p;
    return p == start ? NULL : p;
}

int iha__temp_name_parse(const char *name, size_t *target_length, long *pid)
{
    /* The last TEMP_TAG is the one: a target may hold the tag itself. */
    const char *at = NULL;
    for (const char *p = strstr(name, TEMP_TAG); p; p = strstr(p + 1, TEMP_TAG)) at = p;
    if (at == NULL || at == name) return 0;
    const char *p = skip_digits(at + strlen(TEMP_TAG), 0), *pid_end = p;
    if (p == NULL || *p++ != '.' || (p = skip_digits(p, 1)) == NULL || *p++ != '.' || (p = skip_digits(p, 0)) == NULL ||
        *p != '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    const long v = strtol(at + strlen(TEMP_TAG), &end, 10);
    if (errno != 0 || end != pid_end) return 0;
    *target_length = (size_t)(at - name);
    *pid = v;
    return 1;
}

static int process_alive(long pid)
{
    if (pid <= 0) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

int iha__file_left_over(const char *dir, const char *name, long pid)
{
    if (!process_alive(pid)) return 1;
    char path[4200];
    int len = snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (len < 0 || (size_t)len >= sizeof path || lstat(path, &st) != 0) return 0;
    return difftime(time(NULL), st.st_mtime) > IHA_STALE_SECONDS;
}

void iha__remove_left_over_temps(const char *dir, int (*ours)(const char *target, size_t length, const void *arg),
                                 const void *arg)
{
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t target = 0;
        long pid = 0;
        if (!iha__temp_name_parse(e->d_name, &target, &pid) || !ours(e->d_name, target, arg)) continue;
        if (!iha__file_left_over(dir, e->d_name, pid)) continue;
        char path[4200];
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len > 0 && (size_t)len < sizeof path) unlink(path);
    }
    closedir(d);
}
