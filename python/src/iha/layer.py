"""The NumPy API: iha.forward for one call, iha.Layer for weights kept on the device, and
iha.KVCache for decoding with a pseudo-token or compact cache. Layouts are doc/spec.md's: x [B,N,D],
wq/wk/wv [D,H*d], wo [H*d,D], alpha_q/k/v [H,H,P] indexed [m][h][p], r [H,H,P] indexed
[h][m][p]. Inputs of any real dtype are converted to the storage type; outputs are float32."""

import ctypes

import numpy as np

from . import _calls, _lib, _opencl
from ._lib import lib
from .context import default_context


class Layer:
    """One IHA layer's weights on a context's device, with its options.

    mask: "causal" (the default), "token_causal" or "none"; window: tokens, 0 for global;
    rope_base: None for no rotary, else the rotary base (rotary needs an even d);
    scale: None for 1/sqrt(d); storage: "float32", "float16" or "bfloat16" (half or bfloat16
    storage of activations and weights, float arithmetic); context: an iha.Context (None: the
    default one).
    The weights are copied when the layer is made: later changes to the arrays do not reach it.
    """

    def __init__(self, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, *, mask="causal", window=0, rope_base=None,
                 scale=None, storage="float32", context=None, _copy=True):
        self.context = context if context is not None else default_context()
        self.dtype = _calls.dtype_of(storage)
        self.storage = storage
        self.options = _calls.options(mask, window, rope_base, scale, storage)
        weights = []
        for name, array in zip(_calls.WEIGHT_NAMES, (wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r)):
            converted = _calls.host(array, self.dtype, name)
            if _copy and np.may_share_memory(converted, np.asarray(array)):
                copy = _calls.empty(converted.shape, self.dtype)
                copy[...] = converted
                converted = copy
            weights.append(converted)
        self._weights = weights
        self.model_dim, self.heads, self.head_dim, self.pseudo = _calls.weights_shape(weights)
        self._uploaded = _calls.upload_weights(self.context, weights)

    def _shape(self, x):
        return _calls.layer_shape(x, self._weights)

    def forward(self, x, *, seq_lens=None):
        """Z = IHA(X) for x [B,N,D]; returns z [B,N,D] float32. seq_lens (None: each batch row
        one sequence) packs sequences of these lengths in tokens, in order over the B*N tokens
        (together B*N, none crossing a batch row): attention, masks, windows and rotary stay
        within each, as separate forward calls on each sequence would give."""
        x = _calls.host(x, self.dtype, "x")
        shape = self._shape(x)
        opts = _calls.with_options(self.options, seq_lens)
        z, _ = _calls.forward(self.context, shape, opts, self._uploaded, x)
        return _calls.to_float32(z)

    __call__ = forward

    def backward(self, x, dz, *, seq_lens=None, out=None, accumulate=False):
        """The gradients of the layer (iha_backward) for x [B,N,D] and dz = dLoss/dz [B,N,D]:
        a dict with "x" (dx) and each weight's name, float32 arrays (storage float32) or arrays
        of the storage type. out: a dict of gradient arrays to write into (only the names it has
        are computed), each C-contiguous of the storage type (float32, float16, or the bfloat16
        bit patterns of iha.BFLOAT16); accumulate=True adds this call's gradients into them
        (micro-batches) instead of overwriting them. seq_lens as in forward."""
        x = _calls.host(x, self.dtype, "x")
        dz = _calls.host(dz, self.dtype, "dz")
        shape = self._shape(x)
        if tuple(dz.shape) != tuple(x.shape):
            raise ValueError(f"dz must have x's shape {tuple(x.shape)}, not {tuple(dz.shape)}")
        names = ("x",) + _calls.WEIGHT_NAMES
        outputs = _gradient_outputs(names, [x] + self._weights, out, accumulate)
        opts = _calls.with_options(self.options, seq_lens, accumulate)
        _calls.backward(self.context, shape, opts, self._uploaded, x, dz, outputs)
        return _gradient_dict(names, outputs, out)

    def core(self, q, k, v, *, seq_lens=None):
        """The layer without its projections (iha_attention_core): y [B,N,H,d] float32 for
        projected q, k, v [B,N,H,d], with the layer's mixing, rotary, attention and collapse
        (wq, wk, wv and wo are not used). seq_lens as in forward."""
        q, k, v = (_calls.host(a, self.dtype, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
        shape = _calls.core_shape(q, k, v, self._weights)
        opts = _calls.with_options(self.options, seq_lens)
        return _calls.to_float32(_calls.core(self.context, shape, opts, self._uploaded, q, k, v))

    def core_backward(self, q, k, v, dy, *, seq_lens=None, out=None, accumulate=False):
        """The gradients of core (iha_attention_core_backward) for dy = dLoss/dy [B,N,H,d]: a
        dict with "q", "k", "v" and the mixing weights' names ("alpha_q", "alpha_k", "alpha_v",
        "r"). out and accumulate as in backward; seq_lens as in forward."""
        q, k, v, dy = (_calls.host(a, self.dtype, n) for a, n in ((q, "q"), (k, "k"), (v, "v"), (dy, "dy")))
        shape = _calls.core_shape(q, k, v, self._weights)
        if tuple(dy.shape) != tuple(q.shape):
            raise ValueError(f"dy must have q's shape {tuple(q.shape)}, not {tuple(dy.shape)}")
        names = ("q", "k", "v") + _calls.WEIGHT_NAMES[4:]
        outputs = _gradient_outputs(names, [q, k, v] + self._weights[4:], out, accumulate)
        opts = _calls.with_options(self.options, seq_lens, accumulate)
        _calls.core_backward(self.context, shape, opts, self._uploaded, q, k, v, dy, outputs)
        return _gradient_dict(names, outputs, out)

    # The layer stages (iha_layer_expand, iha_layer_collapse and their backwards): forward is
    # expand, attention, collapse, so that an application can run the attention step its own
    # way (iha.attention_partial over a sequence split into runs, one per process or device).

    def expand(self, x, *, first_token=0, seq_lens=None):
        """The stages before attention (iha_layer_expand): qt, kt, vt [B,H,N*P,d] float32 for
        x [B,N,D] (projections, mixing and, with rope_base, rotary of qt and kt). x may be a run
        of tokens of a longer sequence: first_token, its first token in the whole sequence, sets
        its rotary positions. seq_lens as in forward (then first_token must be 0)."""
        x = _calls.host(x, self.dtype, "x")
        shape = self._shape(x)
        first = _calls.first_token(first_token)
        opts = _calls.with_options(self.options, seq_lens)
        return tuple(_calls.to_float32(a) for a in _calls.expand(self.context, shape, opts, self._uploaded, first, x))

    def collapse(self, o):
        """The stages after attention (iha_layer_collapse): z [B,N,D] float32 for the attention
        step's output o [B,H,N*P,d] (collapse by r, then the output projection)."""
        o = _calls.host(o, self.dtype, "o")
        shape = _calls.stage_shape(o, None, self._weights)
        return _calls.to_float32(_calls.collapse(self.context, shape, self.options, self._uploaded, o))

    def collapse_backward(self, o, dz, *, out=None, accumulate=False):
        """The backward of collapse (iha_layer_collapse_backward) for its o and dz = dLoss/dz
        [B,N,D]: a dict with "o" (dLoss/do [B,H,N*P,d], the dout of iha.attention_backward),
        "wo" and "r". out and accumulate as in backward (accumulate adds into "o" too)."""
        o = _calls.host(o, self.dtype, "o")
        dz = _calls.host(dz, self.dtype, "dz")
        shape = _calls.stage_shape(o, ("dz", dz), self._weights)
        names = ("o", "wo", "r")
        outputs = _gradient_outputs(names, [o, self._weights[3], self._weights[7]], out, accumulate)
        opts = _calls.with_options(self.options, None, accumulate)
        _calls.collapse_backward(self.context, shape, opts, self._uploaded, o, dz, outputs)
        return _gradient_dict(names, outputs, out)

    def expand_backward(self, x, dqt, dkt, dvt, *, first_token=0, seq_lens=None, out=None, accumulate=False):
        """The backward of expand (iha_layer_expand_backward) for its x and first_token and
        dqt, dkt, dvt [B,H,N*P,d] (as iha.attention_backward returns them): a dict with "x"
        (dx), "wq", "wk", "wv", "alpha_q", "alpha_k" and "alpha_v". out and accumulate as in
        backward: over the runs of one sequence, accumulate=True adds each run's share of the
        weights' gradients into the same arrays. seq_lens as in expand."""
        x = _calls.host(x, self.dtype, "x")
        self._shape(x)
        grads = [_calls.host(a, self.dtype, n) for a, n in ((dqt, "dqt"), (dkt, "dkt"), (dvt, "dvt"))]
        shape = _calls.stage_shape(grads[0], ("x", x), self._weights)
        for name, array in zip(("dkt", "dvt"), grads[1:]):
            if tuple(array.shape) != tuple(grads[0].shape):
                raise ValueError(f"{name} must have dqt's shape {tuple(grads[0].shape)}, not {tuple(array.shape)}")
        first = _calls.first_token(first_token)
        names = ("x", "wq", "wk", "wv", "alpha_q", "alpha_k", "alpha_v")
        likes = [x] + self._weights[:3] + self._weights[4:7]
        outputs = _gradient_outputs(names, likes, out, accumulate)
        opts = _calls.with_options(self.options, seq_lens, accumulate)
        _calls.expand_backward(self.context, shape, opts, self._uploaded, first, x, *grads, outputs)
        return _gradient_dict(names, outputs, out)

    def kv_cache(self, batch, max_tokens, storage=None, *, cache_tokens=0, window=None, compact=False):
        """An empty KVCache for `batch` sequences of up to max_tokens tokens each (storage None:
        the layer's). cache_tokens L below max_tokens makes it a ring of each sequence's last L
        tokens for a windowed layer (window None: the layer's; L at least the window): memory
        that does not grow with the sequence (iha_kv_cache_create_with). compact: the compact
        layout (see KVCache)."""
        return KVCache(self, batch, max_tokens, storage or self.storage, cache_tokens=cache_tokens,
                       window=self.options.window if window is None else window, compact=compact)


def _gradient_outputs(names, likes, out, accumulate):
    if out is not None:
        unknown = set(out) - set(names)
        if unknown:
            raise ValueError(f"out has no gradient named {sorted(unknown)}; the names are {list(names)}")
    elif accumulate:
        raise ValueError("accumulate=True adds into existing gradients: pass them as out")
    wanted = [out is None or name in out for name in names]
    given = [None if out is None else out.get(name) for name in names]
    return _calls.gradient_arrays(list(zip(names, likes)), wanted, given, accumulate)


def _gradient_dict(names, outputs, out):
    return {name: (array if out is not None else _calls.to_float32(array))
            for name, array in zip(names, outputs) if array is not None}


def forward(x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, *, mask="causal", window=0, rope_base=None, scale=None,
            storage="float32", seq_lens=None, context=None):
    """One IHA layer (iha_forward) on host arrays: returns z [B,N,D] float32. See Layer for
    the options and seq_lens; for repeated calls with the same weights, a Layer uploads them once."""
    layer = Layer(wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, mask=mask, window=window, rope_base=rope_base,
                  scale=scale, storage=storage, context=context, _copy=False)
    return layer.forward(x, seq_lens=seq_lens)


class KVCache:
    """The pseudo-key and pseudo-value cache of one layer for incremental decoding
    (iha_kv_cache_*, iha_decode_step): prefill() appends a chunk of tokens per sequence, step()
    one token per sequence, and both return the new tokens' outputs, equal (within rounding) to
    the rows of a full forward over everything appended so far.

    storage: "float32" or "float16" for the keys and values. cache_tokens: 0 (or at least
    max_tokens) keeps every token; L below max_tokens keeps a ring of each sequence's last L
    tokens, for steps with a window of 1 to `window` tokens (window <= L), so sequences grow to
    max_tokens in memory that depends only on L (nbytes); truncate() then rewinds only within
    what the ring holds (include/iha.h, iha_kv_cache_create_with). compact: keep the heads' own
    keys and values (1/P of the bytes) and mix them into pseudo-tokens on read; its steps keep
    the layer's rotary setting of the first one after a reset."""

    def __init__(self, layer, batch, max_tokens, storage="float32", *, cache_tokens=0, window=0, compact=False):
        self.layer = layer
        self.context = layer.context
        self.batch, self.max_tokens = int(batch), int(max_tokens)
        self.cache_tokens, self.window = int(cache_tokens), int(window)
        self.compact = bool(compact)
        _calls.dtype_of(storage)
        if self.cache_tokens < 0:
            raise ValueError(f"cache_tokens must be at least 0, not {self.cache_tokens}")
        shape = _lib.Shape(self.batch, self.max_tokens, layer.model_dim, layer.heads, layer.head_dim, layer.pseudo)
        options = _lib.KVCacheOptions()
        lib.iha_kv_cache_options_init(ctypes.byref(options))
        options.storage = _lib.STORAGES[storage]
        options.window = self.window
        options.cache_tokens = self.cache_tokens
        options.compact = int(self.compact)
        handle = ctypes.c_void_p()
        with self.context.lock:
            self.context.check(lib.iha_kv_cache_create_with(self.context.handle, ctypes.byref(shape),
                                                            ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

    @property
    def is_ring(self):
        """True when the cache keeps only each sequence's last cache_tokens tokens."""
        return 0 < self.cache_tokens < self.max_tokens

    def _run(self, x, counts, seq_lens=None):
        layer = self.layer
        x = _calls.host(x, layer.dtype, "x")
        opts = layer.options
        if seq_lens is not None:
            lengths = _calls.sequence_lengths(seq_lens)
            if counts is not None or len(lengths) != self.batch:
                raise ValueError(f"a packed prefill takes {self.batch} seq_lens and no counts")
            if x.ndim != 2 or x.shape[0] != sum(lengths) or x.shape[1] != layer.model_dim:
                raise ValueError(f"x must be [sum(seq_lens) = {sum(lengths)}, {layer.model_dim}], not {tuple(x.shape)}")
            tokens = max(max(lengths), 1)
            opts = _calls.with_options(opts, lengths)
        elif x.ndim != 3 or x.shape[0] != self.batch or x.shape[2] != layer.model_dim:
            raise ValueError(f"x must be [{self.batch}, k, {layer.model_dim}], not {tuple(x.shape)}")
        else:
            tokens = x.shape[1]
        shape = _lib.Shape(self.batch, tokens, layer.model_dim, layer.heads, layer.head_dim, layer.pseudo)
        count_array = None
        if counts is not None:
            if len(counts) != self.batch:
                raise ValueError(f"counts must have {self.batch} entries, not {len(counts)}")
            count_array = (ctypes.c_uint32 * self.batch)(*[int(c) for c in counts])
        z = _calls.empty(x.shape, x.dtype)
        with self.context.lock:
            x_buffer = _opencl.input_buffer(self.context, x)
            z_buffer = _opencl.output_buffer(self.context, z)
            self.context.check(lib.iha_decode_step(self.context.handle, self._handle, ctypes.byref(shape),
                                                   ctypes.byref(opts), ctypes.byref(layer._uploaded[1]),
                                                   count_array, x_buffer.buffer(), z_buffer.buffer()))
            self.context.finish()
            _opencl.finish_output(self.context, z_buffer)
        return _calls.to_float32(z)

    def prefill(self, x, counts=None, *, seq_lens=None):
        """Appends x [B,k,D] (sequence b: its first counts[b] rows; counts None: all k) and
        returns their outputs [B,k,D] (rows past counts[b] are 0). A packed prefill: seq_lens
        (B lengths, 0 allowed) with x [sum(seq_lens),D], the new tokens of every sequence back
        to back, sequence 0's first, and outputs in the same layout."""
        return self._run(x, counts, seq_lens)

    def step(self, x):
        """Appends one token per sequence, x [B,D], and returns its outputs [B,D]."""
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"x must be [{self.batch}, {self.layer.model_dim}], not {tuple(x.shape)}")
        return self._run(x[:, None, :], None)[:, 0, :]

    def length(self, b=0):
        """The number of tokens sequence b holds."""
        return lib.iha_kv_cache_length(self._handle, b)

    @property
    def nbytes(self):
        """Device bytes of the cached keys and values."""
        return lib.iha_kv_cache_bytes(self._handle)

    def reset(self):
        """Forgets every sequence's tokens."""
        with self.context.lock:
            lib.iha_kv_cache_reset(self._handle)

    def truncate(self, b, tokens):
        """Rewinds sequence b to its first `tokens` tokens (a ring: within what it holds, else
        InvalidArgumentError and nothing changed)."""
        with self.context.lock:
            self.context.check(lib.iha_kv_cache_truncate(self._handle, b, tokens))

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            with self.context.lock:
                lib.iha_kv_cache_free(handle)

    def __del__(self):
        self.close()
