/* What the calls of iha_multi.h share: the split of the sequence over the contexts, the checks of
 * every part's arguments before anything is enqueued, failures reported in the right context,
 * the staging buffers, and key and value blocks carried through host memory. */
#ifndef IHA_MULTI_MULTI_H
#define IHA_MULTI_MULTI_H
#include "iha_multi.h"
#include "runtime/workspace.h"

/* Each context's staging buffers: a key block, its value block, and their gradients (backward);
 * the running log-sum-exp of a part whose lse has mem NULL (forward); the layer's part of the
 * pseudo-queries, -keys, -values, the attention's output and z's stand-in (iha_multi_forward);
 * the layer backward's stand-ins: dout, dqt, dkt, dvt, dx and the part's weight gradients
 * (iha_multi_backward). */
enum {
    IHA_WS_MULTI_K = IHA_WS_MULTI_BASE,
    IHA_WS_MULTI_V,
    IHA_WS_MULTI_DK,
    IHA_WS_MULTI_DV,
    IHA_WS_MULTI_LSE,
    IHA_WS_MULTI_QT,
    IHA_WS_MULTI_KT,
    IHA_WS_MULTI_VT,
    IHA_WS_MULTI_O,
    IHA_WS_MULTI_DOUT,
    IHA_WS_MULTI_DQT,
    IHA_WS_MULTI_DKT,
    IHA_WS_MULTI_DVT,
    IHA_WS_MULTI_DX,
    IHA_WS_MULTI_GRADS,
    IHA_WS_MULTI_Z,
    IHA_WS_MULTI_END
};
_Static_assert((int)IHA_WS_MULTI_END <= (int)IHA_WS_COUNT, "the multi-context slots pass the workspace's end");

/* One call over the contexts. */
typedef struct multi_run {
    const char *call;
    iha_context *const *ctx;
    size_t R;        /* parts, one per context */
    iha_shape shape; /* the whole sequence's */
    iha_attention_options options;
    size_t *start;      /* R + 1 token boundaries: part j holds start[j] .. start[j+1] - 1 */
    size_t row_elems;   /* B*H*P*d: floats of one token over the batch and heads */
    size_t lse_elems;   /* B*H*P: lse entries of one token */
    size_t block_elems; /* the largest part's row_elems * tokens */
    cl_event *ready;    /* per block: its host copy's read, NULL once waited for */
} multi_run;

/* Starts the call on every context (messages cleared), checks the common arguments (a layer
 * call's: model_dim too, rotary allowed) and fills *m; on failure every context of the array
 * holds the message and nothing needs closing. */
iha_status multi_open(multi_run *m, const char *call, iha_context *const *contexts, size_t count,
                      const iha_shape *shape, const iha_attention_options *options, int layer);
void multi_close(multi_run *m);

size_t multi_tokens(const multi_run *m, size_t j);
/* Part j's shape: the whole one with its tokens. */
iha_shape multi_part_shape(const multi_run *m, size_t j);
/* Floats of part j's [B][H][tokens*P][d] tensors and of its lse. */
size_t multi_part_elems(const multi_run *m, size_t j);
size_t multi_part_lse(const multi_run *m, size_t j);
/* Whether some query of part i sees some key of block j under the mask and window. */
int multi_visible(const multi_run *m, size_t i, size_t j);
/* Whether another part than j sees block j, so that its keys and values go through the host. */
int multi_needed(const multi_run *m, size_t j);

/* The tensors of one call: `n` arrays of R buffers with their names, the first `first_out` of
 * them inputs; is_lse[t] marks the [B][H][tokens*P] ones, optional[t] those whose mem may be
 * NULL (nothing checked then). Checks every part's buffers (against its context), then every
 * output apart from every other tensor of every part. */
typedef struct multi_tensors {
    int n, first_out;
    const iha_buffer *const *arrays;
    const char *const *names;
    const int *is_lse, *optional;
} multi_tensors;
iha_status multi_check_tensors(const multi_run *m, const multi_tensors *t);

/* Records a failure of part i in its context, the message naming the call and the part (with
 * `what`, when not NULL, before the message the context already holds). Returns status. */
iha_status multi_fail_part(const multi_run *m, size_t i, iha_status status, const char *what);

/* Records a failure of the call as a whole (host memory) in every context: "call: what". */
iha_status multi_fail_all(const multi_run *m, iha_status status, const char *what);

/* Staging buffer `slot` of context i with at least `floats` floats. */
iha_status multi_staging(const multi_run *m, size_t i, int slot, size_t floats, cl_mem *out);

/* Block j's place in host memory of 2*B*H*N*P*d floats: its keys, then its values. */
float *multi_host_block(const multi_run *m, float *host, size_t j);
/* Enqueues the host copy of kt[j] and vt[j] for every block multi_needed, without waiting;
 * multi_ready waits for one. */
iha_status multi_read_blocks(multi_run *m, const iha_buffer *kt, const iha_buffer *vt, float *host);
iha_status multi_ready(multi_run *m, size_t j);
/* Non-blocking transfers of `floats` floats on context i's queue; the host memory must stay
 * until the queue has finished. event may be NULL. */
iha_status multi_write(const multi_run *m, size_t i, const float *src, cl_mem dst, size_t floats);
iha_status multi_read(const multi_run *m, size_t i, cl_mem src, float *dst, size_t floats, cl_event *event);
/* Flushes context i's queue so that its device starts on what was enqueued. */
iha_status multi_flush(const multi_run *m, size_t i);
/* Waits for every context's queue, then ends the call on each (iha_context's call end: the loop
 * probe's verdict, the program cache); returns st, or the first failure of these. */
iha_status multi_finish(multi_run *m, iha_status st);
#endif
