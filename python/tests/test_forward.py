"""iha.forward and iha.Layer against the float64 PyTorch reference of doc/spec.md."""

import zlib

import numpy as np
import pytest
import torch

import iha
import reference

# (B, N, D, H, d, P, mask, window, rope_base): ragged sizes, every mask global and windowed,
# rotary, P = 1.
CASES = [
    (2, 7, 24, 3, 8, 2, "causal", 0, None),
    (1, 13, 20, 4, 5, 3, "token_causal", 0, None),
    (3, 5, 16, 2, 6, 4, "none", 0, None),
    (2, 11, 12, 2, 6, 3, "causal", 3, None),
    (1, 9, 18, 3, 7, 2, "token_causal", 2, None),
    (2, 8, 10, 2, 5, 3, "none", 3, None),
    (2, 6, 16, 2, 8, 2, "causal", 0, 10000.0),
    (1, 10, 12, 3, 4, 2, "none", 4, 500.0),
    (2, 9, 16, 4, 4, 1, "causal", 0, None),
    (1, 17, 8, 1, 3, 1, "token_causal", 5, None),
]


def numpy_args(x, weights):
    return [x.numpy()] + [w.numpy() for w in weights]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_matches_reference(context, case):
    B, N, D, H, d, P, mask, window, rope_base = case
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=zlib.crc32(repr(case).encode()))
    z = iha.forward(*numpy_args(x, weights), mask=mask, window=window, rope_base=rope_base, context=context)
    expected = reference.layer(x, *weights, mask=mask, window=window, rope_base=rope_base)
    assert z.dtype == np.float32 and z.shape == (B, N, D)
    assert np.isfinite(z).all()
    assert reference.relative_l2(z, expected) <= 1e-5


def test_scale_and_copies(context, copying_context):
    x, weights = reference.random_layer(2, 6, 12, 2, 6, 2, seed=5)
    expected = reference.layer(x, *weights, mask="none", scale=0.7)
    for ctx in (context, copying_context):
        z = iha.forward(*numpy_args(x, weights), mask="none", scale=0.7, context=ctx)
        assert reference.relative_l2(z, expected) <= 1e-5


def test_multi_head_attention(context):
    """P = 1 with identity mixing and collapse is standard causal multi-head attention."""
    B, N, H, d = 2, 10, 4, 6
    D = H * d
    x, weights = reference.random_layer(B, N, D, H, d, 1, seed=11)
    eye = torch.eye(H, dtype=torch.float64)[:, :, None]
    weights[4:] = [eye.clone() for _ in range(4)]
    wq, wk, wv, wo = weights[:4]
    q, k, v = ((x @ w).reshape(B, N, H, d).transpose(1, 2) for w in (wq, wk, wv))
    mha = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = mha.transpose(1, 2).reshape(B, N, D) @ wo
    z = iha.forward(*numpy_args(x, weights), context=context)
    assert reference.relative_l2(z, expected) <= 1e-5


@pytest.mark.parametrize("mask", ["causal", "token_causal"])
def test_half_storage(context, mask):
    x, weights = reference.random_layer(2, 9, 16, 2, 8, 3, seed=21)
    z = iha.forward(*numpy_args(x, weights), mask=mask, storage="float16", context=context)
    expected = reference.layer(x, *weights, mask=mask)
    assert z.dtype == np.float32
    assert reference.relative_l2(z, expected) <= 2e-3


@pytest.mark.parametrize("mask", ["causal", "none"])
def test_bfloat16_storage(context, mask):
    x, weights = reference.random_layer(2, 9, 16, 2, 8, 3, seed=22)
    z = iha.forward(*numpy_args(x, weights), mask=mask, storage="bfloat16", context=context)
    expected = reference.layer(x, *weights, mask=mask)
    assert z.dtype == np.float32
    error = reference.relative_l2(z, expected)
    assert 0 < error <= 1e-2  # above 0: the tensors were rounded to bfloat16


def test_layer_keeps_its_weights(context):
    x, weights = reference.random_layer(1, 5, 8, 2, 4, 2, seed=3)
    arrays = [w.numpy().astype(np.float32) for w in weights]
    layer = iha.Layer(*arrays, context=context)
    before = layer(x.numpy())
    arrays[0][...] = 0
    assert np.array_equal(layer(x.numpy()), before)
    assert (layer.heads, layer.head_dim, layer.pseudo, layer.model_dim) == (2, 4, 2, 8)


def test_strided_float64_inputs(context):
    """Inputs that are not dense float32 are converted, with the same result."""
    x, weights = reference.random_layer(2, 6, 12, 2, 6, 2, seed=8)
    wide = np.zeros((2, 6, 24))
    wide[:, :, ::2] = x.numpy()
    z = iha.forward(wide[:, :, ::2], *[w.numpy() for w in weights], context=context)
    assert reference.relative_l2(z, reference.layer(x, *weights)) <= 1e-5
