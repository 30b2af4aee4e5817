"""iha.torch.attention, the attention core over interleaved sequences, forward and gradients
against the float64 reference."""

import pytest
import torch

import iha.torch
import reference

# (B, H, N, P, d, mask, window, scale)
CASES = [
    (2, 3, 7, 2, 8, "causal", 0, None),
    (1, 2, 9, 3, 5, "token_causal", 0, None),
    (2, 2, 6, 4, 6, "none", 0, 0.5),
    (1, 3, 11, 2, 4, "causal", 3, None),
    (2, 1, 10, 3, 7, "token_causal", 2, None),
    (1, 2, 8, 2, 16, "none", 3, None),
    (2, 2, 13, 1, 9, "causal", 0, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_matches_reference(context, case):
    B, H, N, P, d, mask, window, scale = case
    g = torch.Generator().manual_seed(N * 100 + d)
    exact = [torch.randn(B, H, N * P, d, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    ours = [t.detach().float().requires_grad_() for t in exact]
    o_exact = reference.attention(*exact, pseudo=P, mask=mask, window=window, scale=scale)
    o = iha.torch.attention(*ours, pseudo=P, mask=mask, window=window, scale=scale, context=context)
    assert reference.relative_l2(o.detach(), o_exact.detach()) <= 1e-5
    dout = torch.randn(o_exact.shape, generator=g, dtype=torch.float64)
    o_exact.backward(dout)
    o.backward(dout.float())
    for name, a, b in zip(("qt", "kt", "vt"), ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 1e-4, name


def test_attention_half_storage(context):
    g = torch.Generator().manual_seed(3)
    exact = [torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    ours = [t.detach().float().requires_grad_() for t in exact]
    o_exact = reference.attention(*exact, pseudo=3)
    o = iha.torch.attention(*ours, pseudo=3, storage="float16", context=context)
    assert o.dtype == torch.float32
    assert reference.relative_l2(o.detach(), o_exact.detach()) <= 2e-3
    o_exact.sum().backward()
    o.sum().backward()
    for a, b in zip(ours, exact):
        assert reference.relative_l2(a.grad, b.grad) <= 2e-3


def test_attention_length_must_divide(context):
    t = torch.randn(1, 1, 7, 4)
    with pytest.raises(ValueError, match="multiple of pseudo"):
        iha.torch.attention(t, t, t, pseudo=2, context=context)
