/*
 * layer_files.c - reading the nine .npy files of a layer and cross-checking their shapes.
 */
#include "common/layer_files.h"

#include <stdio.h>
#include <string.h>

#include "common/fail.h"

static int read_one(const char *dir, const char *name, npy_array *out, char *err, size_t err_size)
{
    char path[4096], why[512];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path)
        return tool_fail(err, err_size, "%s: the directory path is too long", name);
    if (npy_read(path, out, why, sizeof why))
        return tool_fail(err, err_size, "%s: %s", path, why);
    return 0;
}

/* Compares a file's shape with the expected one; `why` says where the expectation comes from. */
static int expect_shape(const char *dir, const char *name, const npy_array *a, const size_t *shape, size_t ndim,
                        const char *why, char *err, size_t err_size)
{
    int same = a->header.ndim == ndim;
    for (size_t i = 0; same && i < ndim; i++)
        same = a->header.shape[i] == shape[i];
    if (same)
        return 0;
    char want[128], got[128];
    npy_format_shape(shape, ndim, want, sizeof want);
    npy_format_shape(a->header.shape, a->header.ndim, got, sizeof got);
    return tool_fail(err, err_size, "%s/%s: expected shape %s %s, got %s", dir, name, want, why, got);
}

static int check_shapes(const char *dir, layer_files *f, char *err, size_t err_size)
{
    char got[128];
    const npy_header *x = &f->x.header, *aq = &f->alpha_q.header, *wq = &f->wq.header;
    if (x->ndim != 3 || !x->shape[0] || !x->shape[1] || !x->shape[2]) {
        npy_format_shape(x->shape, x->ndim, got, sizeof got);
        return tool_fail(err, err_size, "%s/x.npy: expected shape [B, N, D] with no zero dimension, got %s", dir, got);
    }
    if (aq->ndim != 3 || aq->shape[0] != aq->shape[1] || !aq->shape[0] || !aq->shape[2]) {
        npy_format_shape(aq->shape, aq->ndim, got, sizeof got);
        return tool_fail(err, err_size, "%s/alpha_q.npy: expected shape [H, H, P] with H, P >= 1, got %s", dir, got);
    }
    size_t b = x->shape[0], n = x->shape[1], dm = x->shape[2], h = aq->shape[0], p = aq->shape[2];
    if (wq->ndim != 2 || wq->shape[0] != dm) {
        npy_format_shape(wq->shape, wq->ndim, got, sizeof got);
        return tool_fail(err, err_size, "%s/wq.npy: expected shape [D, H*d] = (%zu, H*d) (D from x.npy), got %s", dir,
                    dm, got);
    }
    if (wq->shape[1] == 0 || wq->shape[1] % h != 0)
        return tool_fail(err, err_size, "%s/wq.npy: %zu columns are not a positive multiple of H = %zu (H from alpha_q.npy)",
                    dir, wq->shape[1], h);
    size_t hd = wq->shape[1];
    const size_t mix[3] = {h, h, p}, out_proj[2] = {hd, dm};
    if (expect_shape(dir, "wk.npy", &f->wk, wq->shape, 2, "(as wq.npy)", err, err_size) ||
        expect_shape(dir, "wv.npy", &f->wv, wq->shape, 2, "(as wq.npy)", err, err_size) ||
        expect_shape(dir, "wo.npy", &f->wo, out_proj, 2, "[H*d, D] (from wq.npy and x.npy)", err, err_size) ||
        expect_shape(dir, "alpha_k.npy", &f->alpha_k, mix, 3, "(as alpha_q.npy)", err, err_size) ||
        expect_shape(dir, "alpha_v.npy", &f->alpha_v, mix, 3, "(as alpha_q.npy)", err, err_size) ||
        expect_shape(dir, "r.npy", &f->r, mix, 3, "(as alpha_q.npy)", err, err_size))
        return -1;
    f->shape = (iha_shape){.batch = b, .tokens = n, .model_dim = dm, .heads = h, .head_dim = hd / h, .pseudo = p};
    return 0;
}

int layer_files_load(const char *dir, layer_files *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    struct {
        const char *name;
        npy_array *array;
    } files[] = {
        {"x.npy", &out->x},           {"wq.npy", &out->wq},           {"wk.npy", &out->wk},
        {"wv.npy", &out->wv},         {"wo.npy", &out->wo},           {"alpha_q.npy", &out->alpha_q},
        {"alpha_k.npy", &out->alpha_k}, {"alpha_v.npy", &out->alpha_v}, {"r.npy", &out->r},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (read_one(dir, files[i].name, files[i].array, err, err_size)) {
            layer_files_free(out);
            return -1;
        }
    }
    if (check_shapes(dir, out, err, err_size)) {
        layer_files_free(out);
        return -1;
    }
    return 0;
}

iha_host_weights layer_files_weights(const layer_files *f)
{
    return (iha_host_weights){f->wq.data,      f->wk.data,      f->wv.data,      f->wo.data,
                              f->alpha_q.data, f->alpha_k.data, f->alpha_v.data, f->r.data};
}

void layer_files_free(layer_files *f)
{
    npy_free(&f->x);
    npy_free(&f->wq);
    npy_free(&f->wk);
    npy_free(&f->wv);
    npy_free(&f->wo);
    npy_free(&f->alpha_q);
    npy_free(&f->alpha_k);
    npy_free(&f->alpha_v);
    npy_free(&f->r);
}
