/* The tuning profile's file-system side (profile_file.c), shared with profile.c. */
#ifndef IHA_TUNE_PROFILE_FILE_H
#define IHA_TUNE_PROFILE_FILE_H

#include <stddef.h>

#define FORMAT_NAME "iha-tuning-profile"
#define MAX_FILE_BYTES (16u << 20)

/* Whether the file at path may be written over or removed: 0 (*exists says whether there is a
 * file), or an errno and why in *why (profile_file.c says which files are the library's). */
int iha__profile_check_target(const char *path, int *exists, char *why, size_t cap);
/* The directory part of path, malloc'ed ("." when there is none); NULL when out of memory. */
char *iha__profile_parent_dir(const char *path);
/* The tidy-up's filter of temporary files (common/temp_file.h): those of the profile named arg. */
int iha__profile_temp_of(const char *target, size_t length, const void *arg);
/* Opens (creating) <path>.lock and, with lock, takes its exclusive lock: 0 and *fd, or an errno. */
int iha__profile_open_lock(const char *path, int lock, int *fd);

#endif
