/* Replacing a file whole (a temporary file beside it, renamed over it) and removing the
 * temporary files that writers which died left behind. */
#ifndef IHA_COMMON_TEMP_FILE_H
#define IHA_COMMON_TEMP_FILE_H
#include <stddef.h>

/* How old a leftover file must be before it is removed even though a process of the pid in its
 * name is alive (that pid may have been reused, or the writer may sit on another machine that
 * shares the directory). Writing a cache entry or a profile takes far less. */
#define IHA_STALE_SECONDS 3600

typedef struct iha_file_part {
    const void *data;
    size_t length;
} iha_file_part;

/* Writes the parts in order to <path>.tmp.<pid>.<thread token>.<ns> (created exclusively, not
 * following links) with the mode of the regular file it replaces (0644 less the umask for a new
 * one), with fsync when `sync`, and renames it over path, so that readers see the old file or
 * the new one, never a part. Returns 0 or the errno of the step that failed (then
 * nothing is left behind). */
int iha__file_replace(const char *path, const iha_file_part *parts, size_t count, int sync);

/* Whether name is, in full, a temporary name of iha__file_replace: <target>.tmp.<pid>.<hex
 * digits>.<digits>, nothing before or after. Then *target_length is the length of <target>
 * and *pid the writer's pid. */
int iha__temp_name_parse(const char *name, size_t *target_length, long *pid);

/* Whether the file `name` in dir, made by process `pid`, is left over: that process is gone
 * from this machine, or the file is older than IHA_STALE_SECONDS. */
int iha__file_left_over(const char *dir, const char *name, long pid);

/* Removes from dir the left-over temporary files of iha__file_replace whose target (the name
 * they would have been renamed to) `ours` accepts, so that only files whose whole name the
 * library makes are ever removed, never a user's file that merely looks similar. Failures are
 * ignored: another process may remove them first. */
void iha__remove_left_over_temps(const char *dir, int (*ours)(const char *target, size_t length, const void *arg),
                                 const void *arg);
#endif
