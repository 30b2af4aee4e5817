"""The layer stages (Layer.expand, collapse, collapse_backward, expand_backward): composed with
iha.attention and iha.attention_backward they are Layer.forward and Layer.backward; runs of a
sequence expanded with their first_token are the whole sequence's rotated qt and kt (against
the float64 reference); and a layer run sequence-parallel over runs of tokens, with
iha.attention_partial between the stages, equals Layer.forward and Layer.backward."""

import numpy as np
import pytest
import torch

import iha
import reference
from iha import _calls

NAMES = ["x", "wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r"]
# B, N, D, H, d, P, mask, window, rope_base
CASES = [
    (2, 6, 8, 2, 4, 2, "causal", 0, None),
    (1, 7, 8, 2, 4, 3, "token_causal", 2, 1000.0),
    (2, 5, 12, 3, 4, 1, "none", 0, 10000.0),
]
RUNS = [(0, 4), (4, 3), (7, 3)]  # (first token, tokens) of a sequence of 10


def make(case, seed, storage="float32", context=None):
    B, N, D, H, d, P, mask, window, rope_base = case
    x, weights = reference.random_layer(B, N, D, H, d, P, seed=seed)
    layer = iha.Layer(*(w.numpy() for w in weights), mask=mask, window=window, rope_base=rope_base, storage=storage,
                      context=context)
    dz = torch.randn(B, N, D, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return layer, x.numpy(), weights, dz.numpy(), {"pseudo": P, "mask": mask, "window": window}


def case_id(case):
    return "-".join(map(str, case))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_expand_attention_collapse_is_forward(context, case):
    layer, x, _, _, kwargs = make(case, seed=3, context=context)
    qt, kt, vt = layer.expand(x)
    B, N, _, H, d, P = case[:6]
    assert all(a.shape == (B, H, N * P, d) and a.dtype == np.float32 for a in (qt, kt, vt))
    o, _ = iha.attention(qt, kt, vt, context=context, **kwargs)
    z = layer.collapse(o)
    assert z.shape == x.shape and z.dtype == np.float32
    assert reference.relative_l2(z, layer.forward(x)) <= 1e-6


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_stage_backwards_are_backward(context, case):
    layer, x, _, dz, kwargs = make(case, seed=5, context=context)
    qt, kt, vt = layer.expand(x)
    o, lse = iha.attention(qt, kt, vt, context=context, **kwargs)
    late = layer.collapse_backward(o, dz)
    assert sorted(late) == ["o", "r", "wo"]
    dqt, dkt, dvt = iha.attention_backward(qt, kt, vt, o, lse, late["o"], context=context, **kwargs)
    early = layer.expand_backward(x, dqt, dkt, dvt)
    assert sorted(early) == sorted(["x", "wq", "wk", "wv", "alpha_q", "alpha_k", "alpha_v"])
    whole = layer.backward(x, dz)
    for name in NAMES:
        ours = late[name] if name in late else early[name]
        assert ours.dtype == np.float32 and reference.relative_l2(ours, whole[name]) <= 1e-5, name


def test_runs_with_first_token_are_the_whole_sequence(context):
    case = (1, 9, 8, 2, 4, 2, "causal", 0, 100.0)
    layer, x, weights, _, _ = make(case, seed=7, context=context)
    whole = layer.expand(x)
    head, tail = layer.expand(x[:, :4]), layer.expand(x[:, 4:], first_token=4)
    for name, w, h, t in zip(("qt", "kt", "vt"), whole, head, tail):
        assert np.abs(np.concatenate([h, t], axis=2) - w).max() <= 1e-5, name
    # The tail against the float64 reference at its virtual positions 4*P .. 9*P - 1.
    B, N, D, H, d, P = 1, 5, 8, 2, 4, 2
    xs = torch.from_numpy(x[:, 4:]).double()
    positions = torch.arange(4 * P, 9 * P)
    for i, name in enumerate(("qt", "kt", "vt")):
        exact = reference.mix((xs @ weights[i]).reshape(B, N, H, d), weights[4 + i])
        if name != "vt":
            exact = reference.rotate(exact, 100.0, positions)
        assert reference.relative_l2(tail[i], exact) <= 1e-5, name
    # Rotary is there: the tail expanded from position 0 is another sequence's.
    assert np.abs(layer.expand(x[:, 4:])[0] - tail[0]).max() > 1e-2


def test_sequence_parallel_forward(context):
    """The example of doc/python.md: a sequence split into runs, one per process in an
    application; each run's attention merges every run's key block with attention_partial."""
    case = (2, 10, 8, 2, 4, 2, "causal", 3, 1000.0)
    layer, x, _, _, kwargs = make(case, seed=9, context=context)
    runs = [(start, layer.expand(x[:, start:start + n], first_token=start)) for start, n in RUNS]
    z = []
    for q_start, (qt, _, _) in runs:
        o = lse = None
        for i, (k_start, (_, kt, vt)) in enumerate(runs):
            o, lse = iha.attention_partial(qt, kt, vt, o, lse, q_offset=q_start, k_offset=k_start, first=(i == 0),
                                           context=context, **kwargs)
        z.append(layer.collapse(o))
    assert reference.relative_l2(np.concatenate(z, axis=1), layer.forward(x)) <= 1e-5


def test_sequence_parallel_backward(context):
    case = (1, 10, 8, 2, 4, 3, "token_causal", 0, 10000.0)
    layer, x, weights, dz, kwargs = make(case, seed=11, context=context)
    runs = []
    for start, n in RUNS:
        qt, kt, vt = layer.expand(x[:, start:start + n], first_token=start)
        runs.append({"start": start, "n": n, "qt": qt, "kt": kt, "vt": vt})
    for run in runs:
        o = lse = None
        for i, other in enumerate(runs):
            o, lse = iha.attention_partial(run["qt"], other["kt"], other["vt"], o, lse, q_offset=run["start"],
                                           k_offset=other["start"], first=(i == 0), context=context, **kwargs)
        run["o"], run["lse"] = o, lse
    # Every run adds its share of the weights' gradients into the same arrays.
    grads = {name: np.zeros(w.shape, np.float32) for name, w in zip(NAMES[1:], weights)}
    for run in runs:
        rows = slice(run["start"], run["start"] + run["n"])
        late = layer.collapse_backward(run["o"], dz[:, rows], out={"o": np.zeros_like(run["o"]), "wo": grads["wo"],
                                                                   "r": grads["r"]}, accumulate=True)
        run["dout"] = late["o"]
        run["dkt"], run["dvt"] = np.zeros_like(run["kt"]), np.zeros_like(run["vt"])
    for run in runs:
        dqt = None
        for i, other in enumerate(runs):
            dqt, _, _ = iha.attention_partial_backward(
                run["qt"], other["kt"], other["vt"], run["o"], run["lse"], run["dout"], q_offset=run["start"],
                k_offset=other["start"], first=(i == 0), dqt=dqt, dkt=other["dkt"], dvt=other["dvt"], accumulate=True,
                context=context, **kwargs)
        run["dqt"] = dqt
    dx = []
    for run in runs:
        rows = slice(run["start"], run["start"] + run["n"])
        out = {name: grads[name] for name in ("wq", "wk", "wv", "alpha_q", "alpha_k", "alpha_v")}
        early = layer.expand_backward(x[:, rows], run["dqt"], run["dkt"], run["dvt"], first_token=run["start"],
                                      out={"x": np.zeros(x[:, rows].shape, np.float32), **out}, accumulate=True)
        dx.append(early["x"])
    whole = layer.backward(x, dz)
    assert reference.relative_l2(np.concatenate(dx, axis=1), whole["x"]) <= 1e-5
    for name in NAMES[1:]:
        assert reference.relative_l2(grads[name], whole[name]) <= 1e-5, name


def test_out_and_accumulate(context):
    layer, x, _, dz, kwargs = make(CASES[1], seed=13, context=context)
    qt, kt, vt = layer.expand(x)
    o, lse = iha.attention(qt, kt, vt, context=context, **kwargs)
    late = layer.collapse_backward(o, dz)
    early = layer.expand_backward(x, qt, kt, vt)  # any gradients do for the call's linearity
    out = {"r": np.zeros_like(late["r"])}
    for _ in range(2):
        result = layer.collapse_backward(o, dz, out=out, accumulate=True)
    assert list(result) == ["r"] and result["r"] is out["r"]
    assert reference.relative_l2(out["r"], 2 * late["r"]) <= 1e-6
    out = {"x": np.ones_like(x, dtype=np.float32), "alpha_v": np.zeros_like(early["alpha_v"])}
    layer.expand_backward(x, qt, kt, vt, out=out, accumulate=True)
    assert reference.relative_l2(out["x"], 1 + early["x"]) <= 1e-6
    assert reference.relative_l2(out["alpha_v"], early["alpha_v"]) <= 1e-6
    layer.expand_backward(x, qt, kt, vt, out=out)  # overwritten without accumulate
    assert reference.relative_l2(out["x"], early["x"]) <= 1e-6


@pytest.mark.parametrize("storage,tolerance", [("float16", 5e-3), ("bfloat16", 2e-2)])
def test_16_bit_storage_stages(context, storage, tolerance):
    """16-bit storage rounds qt, kt, vt and o between the stages, which forward keeps in float."""
    layer, x, _, dz, kwargs = make(CASES[1], seed=15, storage=storage, context=context)
    qt, kt, vt = layer.expand(x)
    o, lse = iha.attention(qt, kt, vt, storage=storage, context=context, **kwargs)
    assert reference.relative_l2(layer.collapse(o), layer.forward(x)) <= tolerance
    late = layer.collapse_backward(o, dz)
    dqt, dkt, dvt = iha.attention_backward(qt, kt, vt, o, lse, late["o"], storage=storage, context=context,
                                           **kwargs)
    early = layer.expand_backward(x, dqt, dkt, dvt)
    whole = layer.backward(x, dz)
    for name in NAMES:
        ours = late[name] if name in late else early[name]
        assert ours.dtype == np.float32 and reference.relative_l2(ours, whole[name]) <= tolerance, name
    out = {"r": _calls.empty(late["r"].shape, layer.dtype)}
    assert layer.collapse_backward(o, dz, out=out)["r"] is out["r"]
    assert reference.relative_l2(_calls.to_float32(out["r"]), late["r"]) <= tolerance


def test_packed_expand_and_refusals(context):
    layer, x, _, dz, _ = make((1, 7, 8, 2, 4, 2, "causal", 0, 500.0), seed=17, context=context)
    packed = layer.expand(x, seq_lens=[3, 4])
    for a, b, c in zip(packed, layer.expand(x[:, :3]), layer.expand(x[:, 3:])):
        assert np.abs(a - np.concatenate([b, c], axis=2)).max() <= 1e-5
    qt, kt, vt = packed
    # The library's refusals, with its message.
    with pytest.raises(iha.UnsupportedError, match="first_token must be 0"):
        layer.expand(x, first_token=1, seq_lens=[3, 4])
    with pytest.raises(iha.UnsupportedError, match="first_token must be 0"):
        layer.expand_backward(x, qt, kt, vt, first_token=2, seq_lens=[3, 4])
    with pytest.raises(iha.UnsupportedError, match="first_token"):
        layer.expand(x, first_token=2 ** 40)
    with pytest.raises(iha.InvalidArgumentError):
        layer.expand(x, seq_lens=[3, 3])
    # The package's checks, before any call.
    with pytest.raises(ValueError, match="first_token"):
        layer.expand(x, first_token=-1)
    with pytest.raises(ValueError):
        layer.collapse(qt[:, :1])  # one head of two
    with pytest.raises(ValueError):
        layer.collapse(qt[:, :, :5])  # not a whole number of tokens
    with pytest.raises(ValueError):
        layer.collapse_backward(qt, dz[:, :3])
    with pytest.raises(ValueError):
        layer.collapse_backward(qt, dz, accumulate=True)
    with pytest.raises(ValueError):
        layer.expand_backward(x, qt, kt[:, :, :2], vt)
    with pytest.raises(ValueError):
        layer.expand_backward(x[:, :3], qt, kt, vt)
    with pytest.raises(ValueError):
        layer.expand_backward(x, qt, kt, vt, out={"wo": np.zeros((8, 8), np.float32)})


def test_stages_with_copies(copying_context):
    """The stages' inputs and the arrays they add into travel to the device and back when the
    context copies host arrays."""
    layer, x, _, dz, kwargs = make(CASES[2], seed=19, context=copying_context)
    qt, kt, vt = layer.expand(x, first_token=3)
    o, _ = iha.attention(qt, kt, vt, context=copying_context, **kwargs)
    late, early = layer.collapse_backward(o, dz), layer.expand_backward(x, qt, kt, vt, first_token=3)
    out = {"o": np.ones_like(o), "wo": np.ones_like(late["wo"])}
    layer.collapse_backward(o, dz, out=out, accumulate=True)
    for name in out:
        assert np.abs(out[name] - (1 + late[name])).max() <= 1e-5, name
    out = {"x": np.ones_like(early["x"]), "wq": np.ones_like(early["wq"]), "alpha_k": np.ones_like(early["alpha_k"])}
    layer.expand_backward(x, qt, kt, vt, first_token=3, out=out, accumulate=True)
    for name in out:
        assert np.abs(out[name] - (1 + early[name])).max() <= 1e-5, name
