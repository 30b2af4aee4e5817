"""iha.torch.iha_layer's gradients of all nine inputs against autograd of the float64
reference, and InterleavedHeadAttention."""

import zlib

import pytest
import torch

import iha.torch
import reference

NAMES = ["x", "wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"]
CASES = [
    (2, 7, 12, 3, 4, 2, "causal", 0, None),
    (1, 9, 10, 2, 5, 3, "token_causal", 2, None),
    (2, 6, 8, 2, 6, 2, "none", 0, 10000.0),
    (1, 11, 12, 2, 4, 3, "causal", 3, 1000.0),
    (2, 8, 12, 3, 4, 1, "causal", 0, None),
]


def gradients(case, storage="float32", context=None):
    B, N, D, H, d, P, mask, window, rope_base = case
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=zlib.crc32(repr(case).encode()))
    exact = [t.clone().requires_grad_() for t in [x] + weights]
    ours = [t.float().requires_grad_() for t in [x] + weights]
    kwargs = {"mask": mask, "window": window, "rope_base": rope_base}
    z_exact = reference.layer(*exact, **kwargs)
    z = iha.torch.iha_layer(*ours, storage=storage, context=context, **kwargs)
    dz = torch.randn(z_exact.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    z_exact.backward(dz)
    z.backward(dz.float())
    return z, z_exact, ours, exact


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_gradients_match_reference(context, case):
    z, z_exact, ours, exact = gradients(case, context=context)
    assert z.dtype == torch.float32
    assert reference.relative_l2(z.detach(), z_exact.detach()) <= 1e-5
    for name, a, b in zip(NAMES, ours, exact):
        assert a.grad is not None and a.grad.dtype == torch.float32, name
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4, name


def test_half_storage_gradients(context):
    _, _, ours, exact = gradients(CASES[0], storage="float16", context=context)
    for name, a, b in zip(NAMES, ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 2e-3, name


def test_bfloat16_storage_gradients(context):
    _, _, ours, exact = gradients(CASES[0], storage="bfloat16", context=context)
    for name, a, b in zip(NAMES, ours, exact):
        assert a.grad.dtype == torch.float32, name
        assert reference.relative_l2(a.grad, b.grad) <= 1e-2, name


def test_only_requested_gradients(context):
    x, weights = reference.random_layer(1, 5, 8, 2, 4, 2, seed=1)
    x = x.float().requires_grad_()
    weights = [w.float() for w in weights]
    weights[5].requires_grad_()
    iha.torch.iha_layer(x, *weights, context=context).sum().backward()
    assert x.grad is not None and weights[5].grad is not None
    assert all(w.grad is None for i, w in enumerate(weights) if i != 5)


def test_non_contiguous_inputs(context):
    x, weights = reference.random_layer(2, 6, 8, 2, 4, 2, seed=4)
    dense = [t.float().requires_grad_() for t in [x] + weights]
    # The same values as transposed views of other storage.
    strided = [t.float().transpose(0, -1).contiguous().transpose(0, -1).requires_grad_() for t in [x] + weights]
    assert not strided[0].is_contiguous()
    z1 = iha.torch.iha_layer(*dense, context=context)
    z2 = iha.torch.iha_layer(*strided, context=context)
    assert torch.equal(z1, z2)
    z1.sum().backward()
    z2.sum().backward()
    for a, b in zip(dense, strided):
        assert torch.equal(a.grad, b.grad)


def test_no_graph_without_grad(context):
    x, weights = reference.random_layer(1, 4, 8, 2, 4, 2, seed=2)
    params = [w.float().requires_grad_() for w in weights]
    with torch.no_grad():
        z = iha.torch.iha_layer(x.float(), *params, context=context)
    assert not z.requires_grad


def test_module_starts_as_multi_head_attention(context):
    torch.manual_seed(0)
    module = iha.torch.InterleavedHeadAttention(16, 4, 4, 1, context=context)
    assert [name for name, _ in module.named_parameters()] == NAMES[1:]
    x = torch.randn(2, 7, 16)
    B, N, H, d = 2, 7, 4, 4
    q, k, v = ((x @ w).reshape(B, N, H, d).transpose(1, 2) for w in (module.wq, module.wk, module.wv))
    mha = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = mha.transpose(1, 2).reshape(B, N, H * d) @ module.wo
    assert reference.relative_l2(module(x).detach(), expected.detach()) <= 1e-5


def test_module_initialisation_and_training_step(context):
    torch.manual_seed(0)
    H, P = 3, 4
    module = iha.torch.InterleavedHeadAttention(12, H, 4, P, context=context)
    eye = torch.eye(H)
    for alpha in (module.alpha_q, module.alpha_k, module.alpha_v):
        assert torch.equal(alpha[:, :, 0], eye) and torch.count_nonzero(alpha[:, :, 1:]) == 0
    assert torch.allclose(module.r, eye[:, :, None].expand(H, H, P) / P)
    x, target = torch.randn(2, 5, 12), torch.randn(2, 5, 12)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(module(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is not None for p in module.parameters())


def test_gradients_through_copies(copying_context):
    """The same gradients when tensors are copied to device buffers rather than used in place."""
    z, z_exact, ours, exact = gradients(CASES[1], context=copying_context)
    assert reference.relative_l2(z.detach(), z_exact.detach()) <= 1e-5
    for name, a, b in zip(NAMES, ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4, name
