/* The KV cache of incremental decoding (doc/spec.md, "Decoding with a cache"): its two layouts
 * (pseudo-tokens, or compact: the heads' own keys and values), and the context's list of live
 * caches. kv_cache.c creates and frees caches; decode.c
 * runs the decoding step on one. */
#ifndef IHA_LAYER_KV_CACHE_H
#define IHA_LAYER_KV_CACHE_H
#include "runtime/context.h"

struct iha_kv_cache {
    iha_context *ctx;    /* NULL once the context is freed (iha__kv_caches_detach) */
    iha_kv_cache *prev, *next; /* the context's list of live caches */
    size_t B, max_tokens, H, d, P, t_max;
    iha_storage storage;
    int key_block;       /* keys per block of the keys' layout */
    cl_mem keys, values; /* keys [B][H][ceil(t_max/KB)][d][KB] (attention.cl), values [B][H][t_max][d] */
    size_t bytes;
    /* A compact cache: K and V themselves, [B][slots][H][d] each (slots = max_tokens, a ring
     * ring_tokens + 1), token n at slot n (a ring: n mod slots); t_max and key_block unused.
     * With rotary it keeps each key rotated by its token's position n*P and adds the rotation
     * by the pseudo index p on read, so its steps keep the rotary setting of the first one after
     * a reset (rope_fixed: rope and rope_base hold it). A ring's angles: [P][d] floats, the
     * rotary rows of positions 0 .. P-1 (a table of its positions would outgrow any size). */
    int compact;
    size_t slots;
    cl_mem angles;
    int rope_fixed, rope;
    float rope_base;
    /* A ring (iha_kv_cache_create_with): the last ring_tokens tokens of each sequence in t_max
     * rows (a multiple of the key block), virtual position u at row u mod t_max; 0: every
     * position at its own row. window: the layer's window the ring is sized for. */
    size_t ring_tokens, window;
    size_t *length;      /* tokens per sequence */
    size_t *reach;       /* a ring's longest length per sequence since the last reset */
    cl_int *step;        /* staging of the per-sequence (n0, count) pairs */
};

/* Called by iha_context_free after its queue has finished: the caches keep their buffers (and
 * through them the cl_context) until iha_kv_cache_free, and forget the context. */
void iha__kv_caches_detach(iha_context *ctx);
#endif
