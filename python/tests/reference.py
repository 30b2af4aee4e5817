"""doc/spec.md in plain PyTorch, for float64 checks: einsum mixing and collapse, rotary at
virtual positions, and a softmax over an explicit visibility mask."""

import math

import torch


def visible(tokens, pseudo, mask, window, offset=0):
    """[T_new, T_all] booleans: virtual query t (from virtual position offset) sees key u."""
    length = (tokens + offset // pseudo) * pseudo
    t = torch.arange(offset, length)[:, None]
    u = torch.arange(length)[None, :]
    n, m = t // pseudo, u // pseudo
    if mask == "causal":
        result = u <= t
        if window:
            result &= t - u < window * pseudo
    elif mask == "token_causal":
        result = m <= n
        if window:
            result &= n - m < window
    elif mask == "none":
        result = torch.ones_like(t == u)
        if window:
            result &= (n - m).abs() < window
    else:
        raise ValueError(mask)
    return result


def rotate(x, base, positions):
    """Rotate-half rotary of x [..., T, d] at the given virtual positions [T]."""
    d = x.shape[-1]
    half = d // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=x.dtype) / d)
    angle = positions.to(x.dtype)[:, None] * theta[None, :]
    cos, sin = angle.cos(), angle.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def attention(qt, kt, vt, pseudo=1, mask="causal", window=0, scale=None):
    """O [B,H,T,d] for qt, kt, vt [B,H,T,d]."""
    length, d = qt.shape[-2], qt.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = scale * qt @ kt.transpose(-1, -2)
    seen = visible(length // pseudo, pseudo, mask, window)
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.softmax(scores, dim=-1) @ vt


def mix(projected, alpha):
    """[B,N,H,d] and alpha [m][h][p] -> the virtual sequence [B,H,N*P,d]."""
    B, N, H, d = projected.shape
    P = alpha.shape[2]
    return torch.einsum("bnmc,mhp->bhnpc", projected, alpha).reshape(B, H, N * P, d)


def layer(x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, mask="causal", window=0, rope_base=None, scale=None):
    """Z [B,N,D] of doc/spec.md's forward pass."""
    B, N, _ = x.shape
    H, _, P = alpha_q.shape
    d = wq.shape[1] // H
    qt, kt, vt = (mix((x @ w).reshape(B, N, H, d), a) for w, a in ((wq, alpha_q), (wk, alpha_k), (wv, alpha_v)))
    if rope_base is not None:
        positions = torch.arange(N * P)
        qt, kt = rotate(qt, rope_base, positions), rotate(kt, rope_base, positions)
    o = attention(qt, kt, vt, P, mask, window, scale).reshape(B, H, N, P, d)
    y = torch.einsum("bmnpc,hmp->bnhc", o, r).reshape(B, N, H * d)
    return y @ wo


def relative_l2(value, reference):
    value = torch.as_tensor(value, dtype=torch.float64)
    reference = torch.as_tensor(reference, dtype=torch.float64)
    return (torch.linalg.norm(value - reference) / torch.linalg.norm(reference)).item()


def random_layer(batch, tokens, model_dim, heads, head_dim, pseudo, seed, dtype=torch.float64):
    """x and the eight weights, random (never zeros), scaled so that scores are of order one."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * std)

    inner = heads * head_dim
    x = normal(batch, tokens, model_dim)
    weights = [normal(model_dim, inner, std=model_dim ** -0.5) for _ in range(3)]
    weights.append(normal(inner, model_dim, std=inner ** -0.5))
    weights += [normal(heads, heads, pseudo, std=heads ** -0.5) for _ in range(4)]
    return x, weights
