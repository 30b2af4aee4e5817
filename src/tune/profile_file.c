/* The tuning profile's file-system side: which files a save or a clear may replace, the
 * directory a save tidies, and the lock beside the profile (profile.h's concurrency rules). */
#define _DEFAULT_SOURCE /* flock */
#include "tune/profile_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/file.h"
#include "tune/profile.h"

/* Whether the file at path may be written over or removed: it is missing (ENOENT), empty, or
 * a regular file (not a link) holding a JSON object whose "format" is this library's; any
 * other file (a user's JSON, a device, a FIFO, a link) is not the library's to replace. Returns
 * 0 (*exists says whether there is a file), or an errno and why in *why. */
int iha__profile_check_target(const char *path, int *exists, char *why, size_t cap)
{
    char *text = NULL;
    size_t length = 0;
    const int code = iha__file_read(path, MAX_FILE_BYTES, IHA_FILE_NO_FOLLOW, &text, &length);
    *exists = code != ENOENT;
    if (code == ENOENT) return 0;
    if (code != 0) {
        snprintf(why, cap, "%s", code == IHA_FILE_NOT_REGULAR ? "it is not a regular file (a link, a device, a FIFO "
                                                                "or a socket)"
                                 : code == EFBIG ? "it is larger than 16 MiB"
                                                 : iha__file_error(code));
        return code == IHA_FILE_NOT_REGULAR || code == EFBIG ? EPERM : code;
    }
    cJSON *root = length > 0 ? cJSON_ParseWithLength(text, length) : NULL;
    free(text);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const int ours = length == 0 || (cJSON_IsObject(root) && cJSON_IsString(format) &&
                                     strcmp(format->valuestring, FORMAT_NAME) == 0);
    cJSON_Delete(root);
    if (!ours) snprintf(why, cap, "it is not an %s (remove it or choose another path)", FORMAT_NAME);
    return ours ? 0 : EPERM;
}

/* The directory part of path, malloc'ed ("." when there is none). */
char *iha__profile_parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    const size_t n = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (dir == NULL) return NULL;
    memcpy(dir, slash == NULL ? "." : slash == path ? "/" : path, n);
    dir[n] = '\0';
    return dir;
}

/* The tidy-up's filter of temporary files: only those of the profile itself (arg: its name). */
int iha__profile_temp_of(const char *target, size_t length, const void *arg)
{
    return length == strlen(arg) && strncmp(target, arg, length) == 0;
}

/* Opens (creating) <path>.lock and, with lock, takes the exclusive lock on it. Returns 0 and the
 * descriptor in *fd, or an errno. A file system without flock leaves the descriptor unlocked:
 * writers there still never leave a partial file, only lose the merge's guarantee. */
int iha__profile_open_lock(const char *path, int lock, int *fd)
{
    char lock_path[sizeof ((iha_profile *)0)->path + 8];
    snprintf(lock_path, sizeof lock_path, "%s.lock", path);
    int f = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (f < 0) return errno;
    while (lock && flock(f, LOCK_EX) != 0 && errno == EINTR) continue;
    *fd = f;
    return 0;
}
