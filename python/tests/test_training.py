"""The NumPy training calls: Layer.backward against autograd of the float64 reference, gradient
accumulation over two calls, the core (iha_attention_core) and its backward against autograd of
the reference's mixing, rotary, attention and collapse, and partial attention merged over key
blocks against attention over the whole sequence."""

import numpy as np
import pytest
import torch

import iha
import reference

NAMES = ["x", "wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"]


def layer_and_data(B=2, N=6, D=8, H=2, d=4, P=2, seed=4, **kwargs):
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=seed)
    dz = torch.randn(B, N, D, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return x, weights, dz


def test_backward_matches_reference(context):
    x, weights, dz = layer_and_data()
    layer = iha.Layer(*(w.numpy() for w in weights), rope_base=10000.0, context=context)
    grads = layer.backward(x.numpy(), dz.numpy(), seq_lens=[2, 4, 6])
    exact = [t.clone().requires_grad_() for t in [x] + weights]
    z = torch.cat([reference.layer(exact[0][:1, :2], *exact[1:], rope_base=10000.0),
                   reference.layer(exact[0][:1, 2:], *exact[1:], rope_base=10000.0),
                   reference.layer(exact[0][1:], *exact[1:], rope_base=10000.0)], dim=1)
    z = torch.cat([z[:, :6], z[:, 6:]], dim=0)
    z.backward(dz)
    assert sorted(grads) == sorted(NAMES)
    for name, t in zip(NAMES, exact):
        assert grads[name].dtype == np.float32 and reference.relative_l2(grads[name], t.grad) <= 1e-4, name


@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_backward_accumulate_doubles(context, storage):
    x, weights, dz = layer_and_data(seed=8)
    layer = iha.Layer(*(w.numpy() for w in weights), storage=storage, context=context)
    once = layer.backward(x.numpy(), dz.numpy())
    dtype = layer.dtype
    out = {name: np.zeros(once[name].shape, dtype) for name in ("x", "wq", "alpha_k", "r")}
    first = layer.backward(x.numpy(), dz.numpy(), out=out, accumulate=True)
    assert all(first[name] is out[name] for name in out)
    layer.backward(x.numpy(), dz.numpy(), out=out, accumulate=True)
    tolerance = 1e-6 if storage == "float32" else 2e-3
    for name, array in out.items():
        assert reference.relative_l2(array.astype(np.float64), 2 * once[name].astype(np.float64)) <= tolerance, name
    # Without accumulate the same arrays are overwritten.
    layer.backward(x.numpy(), dz.numpy(), out=out)
    for name, array in out.items():
        assert reference.relative_l2(array.astype(np.float64), once[name]) <= tolerance, name
    with pytest.raises(ValueError):
        layer.backward(x.numpy(), dz.numpy(), accumulate=True)
    with pytest.raises(ValueError):
        layer.backward(x.numpy(), dz.numpy(), out={"x": np.zeros((1, 1), dtype)}, accumulate=True)


def test_attention_backward_accumulate_doubles(context):
    g = torch.Generator().manual_seed(12)
    qt, kt, vt, dout = (torch.randn(1, 2, 12, 4, generator=g).numpy() for _ in range(4))
    o, lse = iha.attention(qt, kt, vt, pseudo=3, context=context)
    once = iha.attention_backward(qt, kt, vt, o, lse, dout, pseudo=3, context=context)
    out = [np.zeros_like(g) for g in once]
    for _ in range(2):
        iha.attention_backward(qt, kt, vt, o, lse, dout, pseudo=3, out=out, accumulate=True, context=context)
    for a, b in zip(out, once):
        assert reference.relative_l2(a, 2 * b.astype(np.float64)) <= 1e-6


def core_reference(q, k, v, alpha_q, alpha_k, alpha_v, r, rope_base=None, mask="causal", window=0):
    B, N, H, d = q.shape
    P = alpha_q.shape[2]
    qt, kt, vt = reference.mix(q, alpha_q), reference.mix(k, alpha_k), reference.mix(v, alpha_v)
    if rope_base is not None:
        positions = torch.arange(N * P)
        qt, kt = reference.rotate(qt, rope_base, positions), reference.rotate(kt, rope_base, positions)
    o = reference.attention(qt, kt, vt, P, mask, window).reshape(B, H, N, P, d)
    return torch.einsum("bmnpc,hmp->bnhc", o, r)


@pytest.mark.parametrize("rope_base,mask,window", [(None, "causal", 0), (10000.0, "token_causal", 2)])
def test_core_backward_matches_autograd(context, rope_base, mask, window):
    B, N, H, d, P = 2, 5, 3, 4, 2
    _, weights, _ = layer_and_data(B, N, 8, H, d, P, seed=21)
    g = torch.Generator().manual_seed(22)
    qkv = [torch.randn(B, N, H, d, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    dy = torch.randn(B, N, H, d, generator=g, dtype=torch.float64)
    mixing = [w.clone().requires_grad_() for w in weights[4:]]
    layer = iha.Layer(*(w.numpy() for w in weights), rope_base=rope_base, mask=mask, window=window, context=context)
    y = layer.core(*(t.detach().numpy() for t in qkv))
    y_exact = core_reference(*qkv, *mixing, rope_base=rope_base, mask=mask, window=window)
    assert reference.relative_l2(y, y_exact.detach()) <= 1e-5
    y_exact.backward(dy)
    grads = layer.core_backward(*(t.detach().numpy() for t in qkv), dy.numpy())
    for name, t in zip(["q", "k", "v", "alpha_q", "alpha_k", "alpha_v", "r"], qkv + mixing):
        assert reference.relative_l2(grads[name], t.grad) <= 1e-4, name
    # Accumulation and a subset of outputs.
    out = {"k": np.zeros((B, N, H, d), np.float32), "r": np.zeros((H, H, P), np.float32)}
    for _ in range(2):
        layer.core_backward(*(t.detach().numpy() for t in qkv), dy.numpy(), out=out, accumulate=True)
    assert reference.relative_l2(out["k"], 2 * qkv[1].grad) <= 1e-4
    assert reference.relative_l2(out["r"], 2 * mixing[3].grad) <= 1e-4


def test_core_packed_equals_each_sequence(context):
    B, N, H, d, P = 1, 7, 2, 4, 2
    _, weights, _ = layer_and_data(B, N, 8, H, d, P, seed=31)
    layer = iha.Layer(*(w.numpy() for w in weights), rope_base=500.0, context=context)
    g = torch.Generator().manual_seed(32)
    q, k, v = (torch.randn(B, N, H, d, generator=g).numpy() for _ in range(3))
    packed = layer.core(q, k, v, seq_lens=[3, 4])
    first, second = layer.core(q[:, :3], k[:, :3], v[:, :3]), layer.core(q[:, 3:], k[:, 3:], v[:, 3:])
    assert np.abs(packed - np.concatenate([first, second], axis=1)).max() <= 1e-5


@pytest.mark.parametrize("mask,window", [("causal", 0), ("token_causal", 2), ("none", 0), ("causal", 3)])
def test_partial_blocks_merge_to_attention(context, mask, window):
    B, H, N, P, d = 1, 2, 10, 2, 4
    blocks = [(0, 4), (4, 3), (7, 3)]  # (first token, tokens)
    g = torch.Generator().manual_seed(41)
    qt, kt, vt, dout = (torch.randn(B, H, N * P, d, generator=g).numpy() for _ in range(4))
    o_whole, lse_whole = iha.attention(qt, kt, vt, pseudo=P, mask=mask, window=window, context=context)
    dq_whole, dk_whole, dv_whole = iha.attention_backward(qt, kt, vt, o_whole, lse_whole, dout, pseudo=P, mask=mask,
                                                          window=window, context=context)

    def rows(block):
        return slice(block[0] * P, (block[0] + block[1]) * P)

    kwargs = {"pseudo": P, "mask": mask, "window": window, "context": context}
    finals, dk, dv = [], np.zeros_like(kt), np.zeros_like(vt)
    for qb in blocks:
        q = np.ascontiguousarray(qt[:, :, rows(qb)])
        o = lse = None
        for i, kb in enumerate(reversed(blocks)):  # any order merges to the same result
            o, lse = iha.attention_partial(q, np.ascontiguousarray(kt[:, :, rows(kb)]),
                                           np.ascontiguousarray(vt[:, :, rows(kb)]), o, lse, q_offset=qb[0],
                                           k_offset=kb[0], first=(i == 0), **kwargs)
        assert np.abs(o - o_whole[:, :, rows(qb)]).max() <= 1e-5
        assert np.abs(lse - lse_whole[:, :, rows(qb)]).max() <= 1e-5
        finals.append((q, o, lse))
    for qb, (q, o, lse) in zip(blocks, finals):
        dq = None
        for i, kb in enumerate(blocks):
            dkb, dvb = (np.ascontiguousarray(a[:, :, rows(kb)]) for a in (dk, dv))
            dq, dkb, dvb = iha.attention_partial_backward(
                q, np.ascontiguousarray(kt[:, :, rows(kb)]), np.ascontiguousarray(vt[:, :, rows(kb)]), o, lse,
                np.ascontiguousarray(dout[:, :, rows(qb)]), q_offset=qb[0], k_offset=kb[0], first=(i == 0), dqt=dq,
                dkt=dkb, dvt=dvb, accumulate=True, **kwargs)
            dk[:, :, rows(kb)], dv[:, :, rows(kb)] = dkb, dvb
        assert reference.relative_l2(dq, dq_whole[:, :, rows(qb)]) <= 1e-5
    assert reference.relative_l2(dk, dk_whole) <= 1e-5
    assert reference.relative_l2(dv, dv_whole) <= 1e-5


def test_partial_refusals(context):
    q = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError):
        iha.attention_partial(q, q, q, q_offset=0, k_offset=0)  # not first: needs a state
    with pytest.raises(ValueError):
        iha.attention_partial(q, q[:, :, :3], q[:, :, :3], q_offset=0, k_offset=0, first=True, pseudo=2)
    with pytest.raises(ValueError):
        iha.attention_partial(q, q, q, q_offset=-1, k_offset=0, first=True)


def test_added_into_arrays_with_copies(copying_context):
    """Arrays a call adds into travel to the device and back when the context copies."""
    x, weights, dz = layer_and_data(seed=51)
    layer = iha.Layer(*(w.numpy() for w in weights), context=copying_context)
    once = layer.backward(x.numpy(), dz.numpy())
    out = {"x": np.ones(x.shape, np.float32), "wv": np.ones(weights[2].shape, np.float32)}
    layer.backward(x.numpy(), dz.numpy(), out=out, accumulate=True)
    for name in out:
        assert np.abs(out[name] - (1 + once[name])).max() <= 1e-5, name
    g = torch.Generator().manual_seed(52)
    qt, kt, vt = (torch.randn(1, 2, 8, 4, generator=g).numpy() for _ in range(3))
    o_whole, lse_whole = iha.attention(qt, kt, vt, context=copying_context)
    o, lse = iha.attention_partial(qt, kt[:, :, :4], vt[:, :, :4], q_offset=0, k_offset=0, first=True,
                                   context=copying_context)
    iha.attention_partial(qt, kt[:, :, 4:], vt[:, :, 4:], o, lse, q_offset=0, k_offset=4, context=copying_context)
    assert np.abs(o - o_whole).max() <= 1e-5 and np.abs(lse - lse_whole).max() <= 1e-5


def test_torch_attention_core_gradients(context):
    import iha.torch
    B, N, H, d, P = 2, 6, 2, 4, 3
    _, weights, _ = layer_and_data(B, N, 8, H, d, P, seed=61)
    g = torch.Generator().manual_seed(62)
    exact = [torch.randn(B, N, H, d, generator=g, dtype=torch.float64) for _ in range(3)] + weights[4:]
    exact = [t.clone().requires_grad_() for t in exact]
    ours = [t.detach().float().requires_grad_() for t in exact]
    seq_lens = [4, 2, 6]
    y = iha.torch.attention_core(*ours, rope_base=10000.0, seq_lens=seq_lens, context=context)
    pieces = []
    for b, (start, stop) in ((0, (0, 4)), (0, (4, 6)), (1, (0, 6))):
        pieces.append(core_reference(*(t[b:b + 1, start:stop] for t in exact[:3]), *exact[3:], rope_base=10000.0))
    y_exact = torch.cat([torch.cat(pieces[:2], dim=1), pieces[2]], dim=0)
    assert reference.relative_l2(y.detach(), y_exact.detach()) <= 1e-5
    dy = torch.randn(y_exact.shape, generator=g, dtype=torch.float64)
    y.backward(dy.float())
    y_exact.backward(dy)
    for name, a, b in zip(["q", "k", "v", "alpha_q", "alpha_k", "alpha_v", "r"], ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4, name
