"""attention.py - the attention core's peers: PyTorch scaled_dot_product_attention, FlexAttention
compiled with a block mask, OpenVINO's ScaledDotProductAttention (opset13); and the float64
reference they are checked against. The problem is doc/spec.md's step 4 on the virtual sequence:
causal (key u visible to query t when u <= t), optionally within a window of `window_keys`
virtual keys (t - u < window_keys), scale 1/sqrt(d)."""

import math

import numpy as np
import torch
import torch.nn.functional as F


def visible_pairs(t, window_keys):
    """The (query, key) pairs the mask lets through, as doc/spec.md's cost model counts them."""
    if window_keys <= 0 or window_keys >= t:
        return t * (t + 1) // 2
    return window_keys * (window_keys + 1) // 2 + (t - window_keys) * window_keys


def inputs(bh, t, d, seed):
    """Random q, k, v of shape [1, bh, t, d] (B = 1, H = bh)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, bh, t, d, generator=g) for _ in range(3)]


def reference_rows(q, k, v, window_keys, rows):
    """The float64 output of the given query rows, [1, bh, len(rows), d]: cheap enough on the
    timed problem itself, so a peer is checked on the very inputs it is timed on."""
    qd, kd, vd = (x.double() for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for t in rows:
        lo = 0 if window_keys <= 0 else max(0, t - window_keys + 1)
        s = torch.einsum("bhc,bhuc->bhu", qd[:, :, t], kd[:, :, lo : t + 1]) * scale
        p = torch.softmax(s, dim=-1)
        out.append(torch.einsum("bhu,bhuc->bhc", p, vd[:, :, lo : t + 1]))
    return torch.stack(out, dim=2)


def check_rows(t, window_keys):
    """Query rows to check: the first ones, those around the window's edge, some in between and
    the last ones."""
    rows = {0, 1, 2, t // 3, t // 2, t - 2, t - 1}
    if 0 < window_keys < t:
        rows |= {window_keys - 2, window_keys - 1, window_keys, window_keys + 1}
    return sorted(r for r in rows if 0 <= r < t)


def dense_mask(t, window_keys):
    """[t, t] booleans, True where the key is visible: for peers without a window of their own."""
    i = torch.arange(t)
    m = i[None, :] <= i[:, None]
    if window_keys > 0:
        m &= (i[:, None] - i[None, :]) < window_keys
    return m


class TorchSdpa:
    """PyTorch's scaled_dot_product_attention, eager: is_causal for the causal mask, a dense
    boolean mask for a window (it has no window of its own)."""

    def prepare(self, q, k, v, window_keys):
        mask = dense_mask(q.shape[2], window_keys) if window_keys > 0 else None

        def run():
            with torch.inference_mode():
                if mask is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return run


class FlexAttention:
    """torch.nn.attention.flex_attention compiled by torch.compile, with a block mask for the
    causal mask or the window, so that it skips the blocks the mask hides."""

    def __init__(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.create_block_mask = create_block_mask
        self.flex = torch.compile(flex_attention)

    def prepare(self, q, k, v, window_keys):
        if window_keys > 0:

            def visible(b, h, qi, ki):
                return (ki <= qi) & (qi - ki < window_keys)

        else:

            def visible(b, h, qi, ki):
                return ki <= qi

        t = q.shape[2]
        block_mask = self.create_block_mask(visible, None, None, t, t, device="cpu")

        def run():
            with torch.no_grad():
                return self.flex(q, k, v, block_mask=block_mask)

        return run


def openvino_compile(model, threads):
    """An OpenVINO model compiled for its CPU plugin with `threads` threads, in float32 (the
    plugin would otherwise pick bf16 on a CPU with AMX or AVX-512 BF16), for one request at a
    time."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    return ov.Core().compile_model(model, "CPU", config)


class OpenVinoSdpa:
    """OpenVINO's ScaledDotProductAttention (opset13) on its CPU plugin: causal=True, or a dense
    boolean mask for a window."""

    def __init__(self, threads):
        self.threads = threads

    def prepare(self, q, k, v, window_keys):
        import openvino as ov
        import openvino.opset13 as ops

        shape = list(q.shape)
        params = [ops.parameter(shape, np.float32, name=n) for n in ("q", "k", "v")]
        feeds = [x.numpy() for x in (q, k, v)]
        if window_keys > 0:
            t = shape[2]
            mask = ops.parameter([t, t], np.bool_, name="mask")
            node = ops.scaled_dot_product_attention(*params, mask, causal=False)
            params.append(mask)
            feeds.append(dense_mask(t, window_keys).numpy())
        else:
            node = ops.scaled_dot_product_attention(*params, causal=True)
        request = openvino_compile(ov.Model([node], params), self.threads).create_infer_request()

        def run():
            request.infer(feeds)
            return torch.from_numpy(request.get_output_tensor(0).data.copy())

        return run
