"""The ring KV cache (KVCache with cache_tokens below max_tokens): decoding far past the ring's
L tokens, token at a time and in chunks longer than the ring takes at once, equals the full
forward over the same tokens; its bytes do not grow with the sequence; rewinds within what it
holds decode right and rewinds below are refused. NumPy only: the reference is iha's forward."""

import numpy as np
import pytest

import iha


def random_layer(D, H, d, P, seed):
    rng = np.random.default_rng(seed)
    shapes = [(D, H * d)] * 3 + [(H * d, D)] + [(H, H, P)] * 4
    return [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]


def relative_l2(out, ref):
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("mask,storage,layer_storage,tolerance", [
    ("causal", "float32", "float32", 1e-5),
    ("token_causal", "float16", "float32", 2e-3),
    ("causal", "float32", "float16", 2e-3),  # half x, z and weights through the sub-steps
])
def test_ring_decodes_far_past_its_tokens(context, mask, storage, layer_storage, tolerance):
    B, N, D, H, d, P, W, L = 2, 48, 16, 2, 8, 2, 3, 6
    x = np.random.default_rng(3).standard_normal((B, N, D)).astype(np.float32)
    layer = iha.Layer(*random_layer(D, H, d, P, 4), mask=mask, window=W, rope_base=10000.0, storage=layer_storage,
                      context=context)
    full = layer(x)
    cache = layer.kv_cache(B, N, storage, cache_tokens=L)
    assert cache.is_ring and cache.window == W
    nbytes = cache.nbytes
    assert nbytes == layer.kv_cache(B, 100 * N, storage, cache_tokens=L).nbytes
    assert nbytes < layer.kv_cache(B, N, storage).nbytes
    # A prompt of 10 tokens: more than the L - W + 1 = 4 the ring takes at once (sub-steps).
    assert relative_l2(cache.prefill(x[:, :10]), full[:, :10]) <= tolerance
    for n in range(10, N):  # 38 more steps, eight times around the ring
        assert relative_l2(cache.step(x[:, n]), full[:, n]) <= tolerance, n
    assert cache.length(0) == cache.length(1) == N
    assert cache.nbytes == nbytes


def test_ring_rewinds_within_what_it_holds(context):
    B, N, D, H, d, P, W, L = 1, 40, 16, 2, 8, 2, 3, 6
    rng = np.random.default_rng(8)
    x = rng.standard_normal((B, N, D)).astype(np.float32)
    layer = iha.Layer(*random_layer(D, H, d, P, 9), window=W, context=context)
    cache = layer.kv_cache(B, N, cache_tokens=L)
    cache.prefill(x[:, :20])
    # n_max 20: the ring holds what a step from token 20 - L + W - 1 = 16 on reads, not from 15.
    with pytest.raises(iha.InvalidArgumentError):
        cache.truncate(0, 15)
    assert cache.length(0) == 20
    cache.truncate(0, 16)
    x[:, 16:] = rng.standard_normal((B, N - 16, D))  # new tokens after the rewind
    full = layer(x)
    z = cache.prefill(x[:, 16:30])  # 14 tokens, in sub-steps
    assert relative_l2(z, full[:, 16:30]) <= 1e-5
    for n in range(30, N):
        assert relative_l2(cache.step(x[:, n]), full[:, n]) <= 1e-5, n


def test_ring_refusals(context):
    layer = iha.Layer(*random_layer(8, 2, 4, 2, 1), window=4, context=context)
    with pytest.raises(iha.InvalidArgumentError):
        layer.kv_cache(1, 30, cache_tokens=3)  # below the window
    with pytest.raises(iha.InvalidArgumentError):
        layer.kv_cache(1, 30, cache_tokens=10, window=0)  # a ring needs a window
    with pytest.raises(ValueError):
        layer.kv_cache(1, 30, cache_tokens=-1)
    assert not layer.kv_cache(1, 30, cache_tokens=30).is_ring  # keeps every token
