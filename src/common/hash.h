/* FNV-1a 64-bit hashing, for cache keys (not for security). */
#ifndef IHA_COMMON_HASH_H
#define IHA_COMMON_HASH_H
#include <stddef.h>
#include <stdint.h>

#define IHA_HASH_SEED UINT64_C(0xcbf29ce484222325)

/* Continues hash `h` over n bytes; start with IHA_HASH_SEED. */
uint64_t iha__hash_bytes(uint64_t h, const void *data, size_t n);
/* Continues hash `h` over a NUL-terminated string, including a terminator so that
 * ("ab","c") and ("a","bc") hash differently. NULL hashes like "". */
uint64_t iha__hash_string(uint64_t h, const char *s);
#endif
