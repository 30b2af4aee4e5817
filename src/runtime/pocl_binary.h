/* Whether a program binary is safe to hand to clCreateProgramWithBinary. */
#ifndef IHA_RUNTIME_POCL_BINARY_H
#define IHA_RUNTIME_POCL_BINARY_H
#include <stddef.h>

/* 1 when the binary may be stored in and loaded from the disk cache. A PoCL binary (it starts
 * with PoCL's magic) must be of a layout version this file knows and well-formed in every
 * record: pocl_binary.c says why. Other drivers' binaries are not judged: 1. */
int iha__binary_loadable(const unsigned char *binary, size_t length);

/* Gives a loadable PoCL binary a build hash drawn from its own bytes (lowercase letters, where
 * PoCL's own are uppercase), so that PoCL unpacks it into a directory of its cache that no
 * build from source and no other binary uses: pocl_binary.c says why. Other drivers' binaries
 * are left as they are. */
void iha__binary_own_build_hash(unsigned char *binary, size_t length);
#endif
