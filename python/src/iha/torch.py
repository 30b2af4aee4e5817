"""The PyTorch API: iha_layer and attention as differentiable functions,
InterleavedHeadAttention as an nn.Module, and KVCache for decoding with a module's weights. CPU tensors in and out; the library computes on the
context's OpenCL device (PoCL on a CPU reads the tensors' memory in place, see doc/python.md).

Layouts are doc/spec.md's (see iha.layer). Inputs may be non-contiguous and of any floating
dtype: each is made a dense array of the storage type (no copy when it already is one), and
outputs and gradients come back in their inputs' dtypes.
"""

import functools
import math

import numpy as np
import torch

from . import _calls, layer as _layer
from .context import default_context

__all__ = ["InterleavedHeadAttention", "KVCache", "attention", "attention_core", "iha_layer"]


def _host(tensor, dtype, name):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{name} is on {tensor.device}: iha.torch takes CPU tensors")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, not {tensor.dtype}")
    tensor = tensor.detach()
    if tensor.dtype not in (torch.float16, torch.float32, torch.float64):
        tensor = tensor.float()
    return _calls.host(tensor.numpy(), dtype, name)


def _first_order(what):
    """The backward of `what`, for torch.autograd.Function: the library computes gradients,
    not their derivatives, so a backward that builds a graph (create_graph=True, for a second
    derivative) is refused by name rather than by autograd's generic error at the second pass."""
    def decorate(backward):
        @functools.wraps(backward)
        def first_order_backward(ctx, *grads):
            if torch.is_grad_enabled():
                raise RuntimeError(f"{what} has no second derivative: its backward runs the library's gradient "
                                   "kernels, which autograd cannot differentiate (create_graph=True, "
                                   "torch.autograd.grad of a gradient)")
            return backward(ctx, *grads)
        return first_order_backward
    return decorate


def _tensor(array, like):
    return torch.from_numpy(np.ascontiguousarray(_calls.to_float32(array) if array.dtype == _calls.BFLOAT16
                                                 else array)).to(like.dtype)


def _wants_graph(tensors):
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


class _Layer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, config, x, *weights):
        context, opts, dtype, save = config
        xh = _host(x, dtype, "x")
        hosts = [_host(w, dtype, name) for name, w in zip(_calls.WEIGHT_NAMES, weights)]
        shape = _calls.layer_shape(xh, hosts)
        uploaded = _calls.upload_weights(context, hosts)
        z, saved = _calls.forward(context, shape, opts, uploaded, xh, save=save)
        if save:
            ctx.save_for_backward(x, *weights)
            ctx.state = (context, shape, opts, uploaded, xh, saved)
        return _tensor(z, x)

    @staticmethod
    @_first_order("iha.torch.iha_layer")
    def backward(ctx, dz):
        inputs = ctx.saved_tensors  # checks that nothing was modified in place since the forward
        context, shape, opts, uploaded, xh, saved = ctx.state
        dzh = _host(dz, xh.dtype, "dz")
        wanted = list(ctx.needs_input_grad[1:])
        grads = _calls.backward_saved(context, shape, opts, uploaded, xh, saved, dzh, wanted)
        return (None, *(None if g is None else _tensor(g, t) for g, t in zip(grads, inputs)))


def _lengths(seq_lens):
    if isinstance(seq_lens, torch.Tensor):
        if seq_lens.is_floating_point() or seq_lens.is_complex():
            raise TypeError(f"seq_lens must hold integers, not {seq_lens.dtype}")
        seq_lens = seq_lens.detach().cpu().numpy()
    return seq_lens


def iha_layer(x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, *, mask="causal", window=0, rope_base=None,
              scale=None, storage="float32", seq_lens=None, context=None):
    """One IHA layer, differentiable in all nine tensors: z [B,N,D] for x [B,N,D].

    The forward runs iha_forward_save (iha_forward when no gradient is needed), the backward
    iha_backward_saved, which reads the attention output and log-sum-exp the forward kept on
    the device. Options as iha.Layer; seq_lens (a sequence or an integer tensor of lengths in
    tokens, None: each batch row one sequence) packs documents into the batch rows as
    iha.Layer.forward's, forward and backward alike."""
    tensors = (x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r)
    context = context if context is not None else default_context()
    opts = _calls.options(mask, window, rope_base, scale, storage, _lengths(seq_lens))
    config = (context, opts, _calls.dtype_of(storage), _wants_graph(tensors))
    return _Layer.apply(config, *tensors)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, config, qt, kt, vt):
        context, opts, dtype, pseudo, save = config
        hosts = [_host(t, dtype, name) for name, t in (("qt", qt), ("kt", kt), ("vt", vt))]
        shape = _calls.attention_shape(*hosts, pseudo)
        o, lse = _calls.attention(context, shape, opts, *hosts, want_lse=save)
        if save:
            ctx.save_for_backward(qt, kt, vt)
            ctx.state = (context, shape, opts, hosts, o, lse)
        return _tensor(o, qt)

    @staticmethod
    @_first_order("iha.torch.attention")
    def backward(ctx, dout):
        inputs = ctx.saved_tensors
        context, shape, opts, hosts, o, lse = ctx.state
        douth = _host(dout, o.dtype, "dout")
        grads = _calls.attention_backward(context, shape, opts, *hosts, o, lse, douth)
        return (None, *(_tensor(g, t) if need else None
                        for g, t, need in zip(grads, inputs, ctx.needs_input_grad[1:])))


def attention(qt, kt, vt, *, pseudo=1, mask="causal", window=0, scale=None, storage="float32", seq_lens=None,
              context=None):
    """The attention core over interleaved sequences, differentiable in qt, kt and vt
    (iha_attention, iha_attention_backward): qt, kt, vt [B,H,T,d] with T = N*P, already mixed
    (and rotated); returns o [B,H,T,d]. `pseudo` (P) gives the masks and windows their token
    structure: virtual position t belongs to token t // P. seq_lens as iha_layer's, in tokens."""
    context = context if context is not None else default_context()
    opts = _calls.options(mask, window, None, scale, storage, _lengths(seq_lens))
    config = (context, opts, _calls.dtype_of(storage), int(pseudo), _wants_graph((qt, kt, vt)))
    return _Attention.apply(config, qt, kt, vt)


class _Core(torch.autograd.Function):
    @staticmethod
    def forward(ctx, config, q, k, v, *mixing):
        context, opts, dtype, save = config
        hosts = [_host(t, dtype, name) for name, t in (("q", q), ("k", k), ("v", v))]
        weights = [None] * 4 + [_host(w, dtype, name) for name, w in zip(_calls.WEIGHT_NAMES[4:], mixing)]
        shape = _calls.core_shape(*hosts, weights)
        uploaded = _calls.upload_mixing(context, weights[4:])
        y = _calls.core(context, shape, opts, uploaded, *hosts)
        if save:
            ctx.save_for_backward(q, k, v, *mixing)
            ctx.state = (context, shape, opts, uploaded, hosts, weights[4:])
        return _tensor(y, q)

    @staticmethod
    @_first_order("iha.torch.attention_core")
    def backward(ctx, dy):
        inputs = ctx.saved_tensors
        context, shape, opts, uploaded, hosts, mixing = ctx.state
        dyh = _host(dy, hosts[0].dtype, "dy")
        likes = list(zip(("q", "k", "v") + _calls.WEIGHT_NAMES[4:], hosts + mixing))
        outputs = _calls.gradient_arrays(likes, list(ctx.needs_input_grad[1:]))
        _calls.core_backward(context, shape, opts, uploaded, *hosts, dyh, outputs)
        return (None, *(None if g is None else _tensor(g, t) for g, t in zip(outputs, inputs)))


def attention_core(q, k, v, alpha_q, alpha_k, alpha_v, r, *, mask="causal", window=0, rope_base=None, scale=None,
                   storage="float32", seq_lens=None, context=None):
    """The layer without its projections (iha_attention_core, iha_attention_core_backward),
    differentiable in all seven tensors: y [B,N,H,d] from projected q, k, v [B,N,H,d] and the
    mixing and collapse weights [H,H,P] (mixing, rotary, attention, collapse), for a model that
    runs its projections itself. The backward recomputes the forward from q, k and v. Options
    and seq_lens as iha_layer's."""
    tensors = (q, k, v, alpha_q, alpha_k, alpha_v, r)
    context = context if context is not None else default_context()
    opts = _calls.options(mask, window, rope_base, scale, storage, _lengths(seq_lens))
    config = (context, opts, _calls.dtype_of(storage), _wants_graph(tensors))
    return _Core.apply(config, *tensors)


class InterleavedHeadAttention(torch.nn.Module):
    """One IHA layer as a module: z = module(x) for x [B,N,model_dim].

    Parameters (doc/spec.md's layouts): wq, wk, wv [model_dim, heads*head_dim], wo
    [heads*head_dim, model_dim], alpha_q, alpha_k, alpha_v [heads, heads, pseudo] indexed
    [m][h][p], r [heads, heads, pseudo] indexed [h][m][p]. The projections start as
    nn.Linear's do (uniform within 1/sqrt(fan_in)); mixing and collapse start identity-like:
    alpha[m][h][0] = 1 when m = h (every other entry 0) and r[h][h][p] = 1/P, so with P = 1 the
    layer starts as multi-head attention exactly.
    """

    def __init__(self, model_dim, heads, head_dim, pseudo, *, mask="causal", window=0, rope_base=None, scale=None,
                 storage="float32", context=None):
        super().__init__()
        for name, value in (("model_dim", model_dim), ("heads", heads), ("head_dim", head_dim), ("pseudo", pseudo)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        model_dim, heads, head_dim, pseudo = int(model_dim), int(heads), int(head_dim), int(pseudo)
        self.model_dim, self.heads, self.head_dim, self.pseudo = model_dim, heads, head_dim, pseudo
        self.mask, self.window, self.rope_base, self.scale, self.storage = mask, window, rope_base, scale, storage
        self.context = context
        _calls.options(mask, window, rope_base, scale, storage)
        inner = heads * head_dim
        for name in ("wq", "wk", "wv"):
            setattr(self, name, torch.nn.Parameter(torch.empty(model_dim, inner)))
        self.wo = torch.nn.Parameter(torch.empty(inner, model_dim))
        for name in ("alpha_q", "alpha_k", "alpha_v", "r"):
            setattr(self, name, torch.nn.Parameter(torch.empty(heads, heads, pseudo)))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        for weight, fan_in in ((self.wq, self.model_dim), (self.wk, self.model_dim), (self.wv, self.model_dim),
                               (self.wo, self.heads * self.head_dim)):
            bound = 1.0 / math.sqrt(fan_in)
            weight.uniform_(-bound, bound)
        eye = torch.eye(self.heads)
        for alpha in (self.alpha_q, self.alpha_k, self.alpha_v):
            alpha.zero_()
            alpha[:, :, 0] = eye
        self.r.copy_(eye[:, :, None].expand(-1, -1, self.pseudo) / self.pseudo)

    def forward(self, x, seq_lens=None):
        """z for x [B,N,model_dim]; seq_lens (None: each batch row one sequence) packs
        sequences of these lengths in tokens into the rows (iha_layer)."""
        return iha_layer(x, self.wq, self.wk, self.wv, self.wo, self.alpha_q, self.alpha_k, self.alpha_v, self.r,
                         mask=self.mask, window=self.window, rope_base=self.rope_base, scale=self.scale,
                         storage=self.storage, seq_lens=seq_lens, context=self.context)

    @torch.no_grad()
    def kv_cache(self, batch, max_tokens, storage=None, *, cache_tokens=0, window=None, compact=False):
        """An empty KVCache for decoding `batch` sequences of up to max_tokens tokens each with
        this module's weights as they are now: they are copied to the device when the cache is
        made, so a later change (an optimizer step, load_state_dict) does not reach it; make a
        new cache then. storage (None: the module's), cache_tokens, window (None: the module's)
        and compact as iha.Layer.kv_cache: compact keeps the heads' own keys and values, 1/P of
        the pseudo-token cache's bytes."""
        weights = [_host(getattr(self, name), _calls.dtype_of(self.storage), name) for name in _calls.WEIGHT_NAMES]
        owner = _layer.Layer(*weights, mask=self.mask, window=self.window, rope_base=self.rope_base, scale=self.scale,
                             storage=self.storage, context=self.context)
        return KVCache(owner.kv_cache(batch, max_tokens, storage, cache_tokens=cache_tokens, window=window,
                                      compact=compact))

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, heads={self.heads}, head_dim={self.head_dim}, pseudo={self.pseudo}, "
                f"mask={self.mask!r}, window={self.window}, rope_base={self.rope_base}, storage={self.storage!r}")


class KVCache:
    """iha.KVCache with tensors: prefill and step take CPU tensors and return the new tokens'
    outputs as tensors of the input's dtype, equal (within rounding) to the rows of the
    module's forward over everything appended so far. Decoding is inference: no autograd graph
    is recorded. Made by InterleavedHeadAttention.kv_cache; the cache underneath is `cache`."""

    def __init__(self, cache):
        self.cache = cache

    def _input(self, x):
        return _host(x, self.cache.layer.dtype, "x")

    def prefill(self, x, counts=None, *, seq_lens=None):
        """Appends x [B,k,D] (sequence b: its first counts[b] rows; counts None: all k), or a
        packed prefill of seq_lens with x [sum(seq_lens),D], and returns the outputs in x's
        layout (iha.KVCache.prefill)."""
        z = self.cache.prefill(self._input(x), counts, seq_lens=seq_lens)
        return _tensor(z, x)

    def step(self, x):
        """Appends one token per sequence, x [B,D], and returns its outputs [B,D]."""
        return _tensor(self.cache.step(self._input(x)), x)

    def length(self, b=0):
        """The number of tokens sequence b holds."""
        return self.cache.length(b)

    @property
    def nbytes(self):
        """Device bytes of the cached keys and values."""
        return self.cache.nbytes

    @property
    def compact(self):
        return self.cache.compact

    def reset(self):
        """Forgets every sequence's tokens."""
        self.cache.reset()

    def truncate(self, b, tokens):
        """Rewinds sequence b to its first `tokens` tokens (iha.KVCache.truncate)."""
        self.cache.truncate(b, tokens)

    def close(self):
        self.cache.close()
