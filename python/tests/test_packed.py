"""Packed sequences (seq_lens): a packed batch against each sequence on its own, at the NumPy
level, in the packed prefill of a KV cache, and in iha.torch with autograd against the float64
reference run per sequence."""

import numpy as np
import pytest
import torch

import iha
import iha.torch
import reference

# (B, N, D, H, d, P, mask, window, rope_base, seq_lens)
CASES = [
    (2, 8, 12, 3, 4, 2, "causal", 0, None, [3, 5, 8]),
    (1, 9, 10, 2, 6, 3, "token_causal", 2, 10000.0, [4, 1, 4]),
    (2, 6, 8, 2, 4, 2, "none", 0, 1000.0, [6, 2, 4]),
    (1, 10, 8, 2, 4, 1, "causal", 3, None, [7, 3]),
]
IDS = ["-".join(map(str, c[:9])) for c in CASES]


def pieces(x, seq_lens):
    """The sequences of a packed [B,N,...] tensor, each [1,n,...]."""
    flat = x.reshape(-1, *x.shape[2:])
    starts = np.cumsum([0] + list(seq_lens))
    return [flat[a:b][None] for a, b in zip(starts[:-1], starts[1:])]


def per_sequence(x, weights, seq_lens, **kwargs):
    outputs = [reference.layer(piece, *weights, **kwargs) for piece in pieces(x, seq_lens)]
    return torch.cat([o[0] for o in outputs]).reshape(x.shape[0], x.shape[1], -1)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_packed_forward_equals_each_sequence(context, case):
    B, N, D, H, d, P, mask, window, rope_base, seq_lens = case
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=len(seq_lens) + N)
    layer = iha.Layer(*(w.numpy() for w in weights), mask=mask, window=window, rope_base=rope_base, context=context)
    packed = layer.forward(x.numpy(), seq_lens=seq_lens)
    separate = [layer.forward(piece.numpy()) for piece in pieces(x, seq_lens)]
    expected = np.concatenate([s[0] for s in separate]).reshape(packed.shape)
    assert np.abs(packed - expected).max() <= 1e-5 * np.abs(expected).max()
    exact = per_sequence(x, weights, seq_lens, mask=mask, window=window, rope_base=rope_base)
    assert reference.relative_l2(packed, exact) <= 1e-5
    # iha.forward takes the same lengths, and with them differs from the unpacked call.
    again = iha.forward(x.numpy(), *(w.numpy() for w in weights), mask=mask, window=window, rope_base=rope_base,
                        seq_lens=np.array(seq_lens), context=context)
    assert np.array_equal(again, packed)
    assert not np.allclose(layer.forward(x.numpy()), packed)


def test_packed_attention_equals_each_sequence(context):
    B, H, N, P, d = 1, 2, 9, 2, 4
    seq_lens = [2, 4, 3]
    g = torch.Generator().manual_seed(3)
    qt, kt, vt = (torch.randn(B, H, N * P, d, generator=g, dtype=torch.float64) for _ in range(3))
    o, lse = iha.attention(qt.numpy(), kt.numpy(), vt.numpy(), pseudo=P, seq_lens=seq_lens, context=context)
    start = 0
    for n in seq_lens:
        rows = slice(start * P, (start + n) * P)
        exact = reference.attention(qt[:, :, rows], kt[:, :, rows], vt[:, :, rows], P)
        assert reference.relative_l2(o[:, :, rows], exact) <= 1e-5
        start += n


def test_bad_lengths_are_refused(context):
    x, weights = reference.random_layer(2, 4, 8, 2, 4, 1, seed=1)
    layer = iha.Layer(*(w.numpy() for w in weights), context=context)
    for bad in ([3, 3, 2], [4, 3], [2, 2, 0, 4]):  # crosses a row, sums short, zero length
        with pytest.raises(iha.InvalidArgumentError):
            layer.forward(x.numpy(), seq_lens=bad)
    with pytest.raises(ValueError):
        layer.forward(x.numpy(), seq_lens=[])
    with pytest.raises(ValueError):
        layer.forward(x.numpy(), seq_lens=[4, -4, 8])


def test_packed_prefill_equals_forward(context):
    B, N, D, H, d, P = 3, 6, 8, 2, 4, 2
    seq_lens = [4, 0, 6]
    x, weights = reference.random_layer(1, sum(seq_lens), D, H, d, P, seed=11)
    layer = iha.Layer(*(w.numpy() for w in weights), rope_base=10000.0, context=context)
    cache = layer.kv_cache(B, N)
    z = cache.prefill(x[0].numpy(), seq_lens=seq_lens)
    assert z.shape == (sum(seq_lens), D)
    assert [cache.length(b) for b in range(B)] == seq_lens
    start = 0
    for n in seq_lens:
        if n:
            expected = layer.forward(x[:, start:start + n].numpy())[0]
            assert np.abs(z[start:start + n] - expected).max() <= 1e-4 * np.abs(expected).max()
        start += n


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_torch_module_packed_gradients(context, case):
    B, N, D, H, d, P, mask, window, rope_base, seq_lens = case
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=5 + N)
    module = iha.torch.InterleavedHeadAttention(D, H, d, P, mask=mask, window=window, rope_base=rope_base,
                                                context=context)
    with torch.no_grad():
        for name, w in zip(iha._calls.WEIGHT_NAMES, weights):
            getattr(module, name).copy_(w)
    xs = x.float().requires_grad_()
    z = module(xs, seq_lens=torch.tensor(seq_lens))
    exact = [t.clone().requires_grad_() for t in [x] + weights]
    z_exact = per_sequence(exact[0], exact[1:], seq_lens, mask=mask, window=window, rope_base=rope_base)
    assert reference.relative_l2(z.detach(), z_exact.detach()) <= 1e-5
    dz = torch.randn(z_exact.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    z.backward(dz.float())
    z_exact.backward(dz)
    ours = [xs] + [getattr(module, name) for name in iha._calls.WEIGHT_NAMES]
    for name, a, b in zip(["x"] + list(iha._calls.WEIGHT_NAMES), ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4, name


def test_torch_attention_packed_gradients(context):
    B, H, N, P, d = 2, 2, 5, 2, 4
    seq_lens = [2, 3, 5]
    g = torch.Generator().manual_seed(9)
    exact = [torch.randn(B, H, N * P, d, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    ours = [t.detach().float().requires_grad_() for t in exact]
    o = iha.torch.attention(*ours, pseudo=P, mask="token_causal", seq_lens=seq_lens, context=context)
    parts, start = [], 0
    for n in seq_lens:
        b, s = divmod(start, N)
        rows = slice(s * P, (s + n) * P)
        parts.append(reference.attention(*(t[b:b + 1, :, rows] for t in exact), P, "token_causal"))
        start += n
    o_exact = torch.cat([torch.cat(parts[:2], dim=2), parts[2]], dim=0)
    assert reference.relative_l2(o.detach(), o_exact.detach()) <= 1e-5
    dout = torch.randn(o_exact.shape, generator=g, dtype=torch.float64)
    o.backward(dout.float())
    o_exact.backward(dout)
    for a, b in zip(ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4
