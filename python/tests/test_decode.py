"""Decoding with iha.KVCache against the full forward pass over the same tokens."""

import numpy as np
import pytest

import iha
import reference


@pytest.mark.parametrize("mask,window,rope_base,storage", [
    ("causal", 0, None, "float32"),
    ("token_causal", 3, 10000.0, "float32"),
    ("none", 0, None, "float32"),
    ("causal", 2, None, "float16"),
    ("causal", 0, 10000.0, "bfloat16"),
])
def test_prefill_and_steps_match_forward(context, mask, window, rope_base, storage):
    B, N, D, H, d, P = 2, 9, 12, 2, 6, 3
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=17)
    x = x.numpy().astype(np.float32)
    layer = iha.Layer(*[w.numpy() for w in weights], mask=mask, window=window, rope_base=rope_base, storage=storage,
                      context=context)
    cache = layer.kv_cache(B, N)
    # Both sides in the layer's storage: each within its contract of float64 (bfloat16's 1e-2),
    # so within twice it of each other.
    tolerance = {"float16": 2e-3, "bfloat16": 2e-2}.get(storage, 1e-5)
    # Each new row equals the last row of a full forward over the tokens so far (under every
    # mask: a bidirectional row sees the tokens before it and itself).
    assert reference.relative_l2(cache.prefill(x[:, :5]), layer(x[:, :5])) <= tolerance
    for n in range(5, N):
        assert reference.relative_l2(cache.step(x[:, n]), layer(x[:, :n + 1])[:, n]) <= tolerance
    assert cache.length(0) == cache.length(1) == N
    assert cache.nbytes > 0


@pytest.mark.parametrize("mask,window,rope_base,storage,cache_tokens", [
    ("causal", 0, 10000.0, "float32", 0),
    ("token_causal", 2, None, "bfloat16", 0),
    ("causal", 3, 10000.0, "float16", 4),
])
def test_compact_cache_matches_forward(context, mask, window, rope_base, storage, cache_tokens):
    B, N, D, H, d, P = 2, 9, 12, 3, 6, 3
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=23)
    x = x.numpy().astype(np.float32)
    layer = iha.Layer(*[w.numpy() for w in weights], mask=mask, window=window, rope_base=rope_base, storage=storage,
                      context=context)
    cache = layer.kv_cache(B, N, cache_tokens=cache_tokens, compact=True)
    pseudo = layer.kv_cache(B, N, cache_tokens=cache_tokens)
    tolerance = {"float16": 2e-3, "bfloat16": 2e-2}.get(storage, 1e-5)
    assert reference.relative_l2(cache.prefill(x[:, :3]), layer(x[:, :3])) <= tolerance
    for n in range(3, N):
        assert reference.relative_l2(cache.step(x[:, n]), layer(x[:, :n + 1])[:, n]) <= tolerance
    if not cache_tokens:
        # 2·H·d elements per token; the pseudo-token cache holds P times that (and key-block padding).
        element = 4 if storage == "float32" else 2
        assert cache.nbytes == 2 * B * N * H * d * element
        assert cache.nbytes * P <= pseudo.nbytes


def test_ragged_counts_and_truncate(context):
    B, N, D, H, d, P = 2, 6, 8, 2, 4, 2
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=5)
    x = x.numpy().astype(np.float32)
    layer = iha.Layer(*[w.numpy() for w in weights], context=context)
    full = layer(x)
    cache = layer.kv_cache(B, N)
    z = cache.prefill(x[:, :4], counts=[4, 2])
    assert cache.length(0) == 4 and cache.length(1) == 2
    assert reference.relative_l2(z[0], full[0, :4]) <= 1e-5
    assert reference.relative_l2(z[1, :2], full[1, :2]) <= 1e-5
    assert not z[1, 2:].any()
    cache.truncate(0, 2)
    cache.prefill(np.stack([x[0, 2:4], x[1, 2:4]]))
    step = cache.step(x[:, 4])
    assert reference.relative_l2(step, full[:, 4]) <= 1e-5
    cache.reset()
    assert cache.length(0) == 0


def test_step_past_the_cache_is_refused(context):
    x, weights = reference.random_layer(1, 3, 8, 2, 4, 2, seed=6)
    layer = iha.Layer(*[w.numpy() for w in weights], context=context)
    cache = layer.kv_cache(1, 2)
    with pytest.raises(iha.InvalidArgumentError) as raised:
        cache.prefill(x.numpy()[:, :3])
    assert isinstance(raised.value, ValueError) and str(raised.value)
    assert cache.length(0) == 0


@pytest.mark.parametrize("compact,rope_base", [(False, 10000.0), (True, None), (True, 10000.0)])
def test_torch_module_decodes_as_its_forward(context, compact, rope_base):
    """InterleavedHeadAttention.kv_cache: prefill and steps with tensors equal the module's
    forward over the tokens so far, in the input's dtype, with no graph; the cache keeps the
    weights it was made with."""
    import torch
    import iha.torch

    B, N, D, H, d, P = 2, 8, 12, 3, 4, 2
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=31)
    module = iha.torch.InterleavedHeadAttention(D, H, d, P, rope_base=rope_base, context=context)
    with torch.no_grad():
        for name, w in zip(iha._calls.WEIGHT_NAMES, weights):
            getattr(module, name).copy_(w)
    x = x.double().requires_grad_()
    cache = module.kv_cache(B, N, compact=compact)
    assert cache.compact == compact
    with torch.no_grad():
        full = module(x.float()).double()
    z = cache.prefill(x[:, :3])
    assert z.dtype == torch.float64 and not z.requires_grad
    assert reference.relative_l2(z, full[:, :3]) <= 1e-5
    with torch.no_grad():
        module.wo.mul_(2.0)  # after the cache was made: not the cache's weights
    for n in range(3, N):
        assert reference.relative_l2(cache.step(x[:, n]), full[:, n]) <= 1e-5
    assert cache.length(1) == N
    cache.truncate(0, 4)
    assert cache.length(0) == 4
    cache.close()
