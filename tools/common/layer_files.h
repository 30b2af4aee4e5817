/*
 * layer_files.h - one IHA layer read from a directory of .npy files (the input of
 * "iha forward"), with every shape checked against the others.
 *
 *   x.npy [B, N, D]   wq.npy wk.npy wv.npy [D, H*d]   wo.npy [H*d, D]
 *   alpha_q.npy alpha_k.npy alpha_v.npy r.npy [H, H, P]
 *
 * H and P come from alpha_q.npy, d = (columns of wq.npy) / H.
 */
#ifndef IHA_TOOLS_LAYER_FILES_H
#define IHA_TOOLS_LAYER_FILES_H

#include <stddef.h>

#include "iha.h"
#include "common/npy.h"

typedef struct layer_files {
    iha_shape shape;
    npy_array x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r;
} layer_files;

/* Reads and checks all nine files. Returns 0, or -1 with a message naming the file and what
 * was expected against what was found; *out then holds no memory. */
int layer_files_load(const char *dir, layer_files *out, char *err, size_t err_size);

/* The weights as the library's host call takes them (pointers into *files). */
iha_host_weights layer_files_weights(const layer_files *files);

void layer_files_free(layer_files *files);

#endif
