"""layer.py - the whole IHA layer written the paper's way in PyTorch (doc/spec.md, "The forward
pass of one layer"): projections as matrix products, head mixing and collapse as einsums, and
scaled_dot_product_attention over the interleaved virtual sequence; forward, forward plus
autograd's backward, and one decoding step against a cache of pseudo-keys and -values."""

import numpy as np
import torch
import torch.nn.functional as F

WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r")


def random_layer(b, n, dim, h, d, p, seed, dtype=torch.float32):
    """x [b, n, dim] and the weights in doc/spec.md's layouts, scaled so that every stage's
    values stay of order one."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    w = {
        "wq": rand(dim, h * d, scale=dim**-0.5),
        "wk": rand(dim, h * d, scale=dim**-0.5),
        "wv": rand(dim, h * d, scale=dim**-0.5),
        "wo": rand(h * d, dim, scale=(h * d) ** -0.5),
        "alpha_q": rand(h, h, p, scale=h**-0.5),
        "alpha_k": rand(h, h, p, scale=h**-0.5),
        "alpha_v": rand(h, h, p, scale=h**-0.5),
        "r": rand(h, h, p, scale=(h * p) ** -0.5),
    }
    return rand(b, n, dim), w


def mix(x_proj, alpha, h, d):
    """[b, n, h*d] -> the virtual sequence [b, h, n*p, d]: Xt[b][h][n*P+p] = sum_m
    alpha[m][h][p] X[b][n][m]."""
    b, n, _ = x_proj.shape
    p = alpha.shape[2]
    mixed = torch.einsum("bnmc,mhp->bhnpc", x_proj.view(b, n, h, d), alpha)
    return mixed.reshape(b, h, n * p, d)


def collapse(o, r, n):
    """O [b, h, n*p, d] -> Y [b, n, h*d]: Y[b][n][h] = sum_m sum_p R[h][m][p] O[b][m][n*P+p]."""
    b, h, _, d = o.shape
    p = r.shape[2]
    y = torch.einsum("bmnpc,hmp->bnhc", o.view(b, h, n, p, d), r)
    return y.reshape(b, n, h * d)


def forward(x, w, h, d):
    """Z for the causal mask over the expanded sequence."""
    n = x.shape[1]
    qt = mix(x @ w["wq"], w["alpha_q"], h, d)
    kt = mix(x @ w["wk"], w["alpha_k"], h, d)
    vt = mix(x @ w["wv"], w["alpha_v"], h, d)
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    return collapse(o, w["r"], n) @ w["wo"]


def openvino_forward(x, w, h, d, threads):
    """forward() converted to an OpenVINO model (its SDPA becomes OpenVINO's
    ScaledDotProductAttention) and compiled for the CPU; returns a callable giving Z."""
    import openvino as ov

    from attention import openvino_compile

    class Layer(torch.nn.Module):
        def forward(self, x):
            return forward(x, w, h, d)

    request = openvino_compile(ov.convert_model(Layer(), example_input=x), threads).create_infer_request()
    feed = [x.numpy()]

    def run():
        request.infer(feed)
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    return run


def gradients(x, w, dz, h, d):
    """dX and every weight's gradient of sum(Z * dz), as iha_backward returns them."""
    leaves = [x.detach().requires_grad_()] + [w[k].detach().requires_grad_() for k in WEIGHT_NAMES]
    z = forward(leaves[0], dict(zip(WEIGHT_NAMES, leaves[1:])), h, d)
    return torch.autograd.grad(z, leaves, grad_outputs=dz)


class DecodeState:
    """A cache of pseudo-keys and -values after mixing, [b, h, t_max, d], holding `tokens`
    tokens (tokens * p virtual positions), as iha_kv_cache keeps it."""

    def __init__(self, kt, vt, t_max):
        b, h, t, d = kt.shape
        self.k = torch.zeros(b, h, t_max, d, dtype=kt.dtype)
        self.v = torch.zeros(b, h, t_max, d, dtype=kt.dtype)
        self.k[:, :, :t] = kt
        self.v[:, :, :t] = vt
        self.used = t

    def rewind(self, used):
        self.used = used


def decode_step(state, x_new, w, h, d):
    """One new token per sequence (x_new [b, 1, dim]): its P pseudo-queries attend to the cache
    and to the new pseudo-keys at or before their own virtual position; returns z [b, 1, dim]."""
    p = w["alpha_q"].shape[2]
    qt = mix(x_new @ w["wq"], w["alpha_q"], h, d)
    t0 = state.used
    state.k[:, :, t0 : t0 + p] = mix(x_new @ w["wk"], w["alpha_k"], h, d)
    state.v[:, :, t0 : t0 + p] = mix(x_new @ w["wv"], w["alpha_v"], h, d)
    state.used = t0 + p
    keys = torch.arange(t0 + p)
    visible = keys[None, :] <= (t0 + torch.arange(p))[:, None]
    o = F.scaled_dot_product_attention(qt, state.k[:, :, : t0 + p], state.v[:, :, : t0 + p], attn_mask=visible)
    return collapse(o, w["r"], 1) @ w["wo"]


def cache_of(x, w, h, d):
    """The pseudo-keys and -values of tokens x, for DecodeState."""
    return mix(x @ w["wk"], w["alpha_k"], h, d), mix(x @ w["wv"], w["alpha_v"], h, d)


def save_npy_layer(directory, x, w):
    """The files `iha forward --in DIR` reads (float32, C order)."""
    np.save(f"{directory}/x.npy", x.numpy().astype(np.float32))
    for k in WEIGHT_NAMES:
        np.save(f"{directory}/{k}.npy", w[k].numpy().astype(np.float32))
