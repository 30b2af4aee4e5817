"""The NumPy API: iha.forward for one call, iha.Layer for weights kept on the device, and
iha.KVCache for decoding with a pseudo-token cache. Layouts are doc/spec.md's: x [B,N,D],
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
        H, _, P = weights[4].shape
        self.heads, self.pseudo = H, P
        self.model_dim = weights[0].shape[0]
        self.head_dim = weights[0].shape[1] // H
        self._uploaded = _calls.upload_weights(self.context, weights)

    def _shape(self, x):
        return _calls.layer_shape(x, self._weights)

    def forward(self, x):
        """Z = IHA(X) for x [B,N,D]; returns z [B,N,D] float32."""
        x = _calls.host(x, self.dtype, "x")
        shape = self._shape(x)
        z, _ = _calls.forward(self.context, shape, self.options, self._uploaded, x)
        return _calls.to_float32(z)

    __call__ = forward

    def kv_cache(self, batch, max_tokens, storage=None, *, cache_tokens=0, window=None):
        """An empty KVCache for `batch` sequences of up to max_tokens tokens each (storage None:
        the layer's). cache_tokens L below max_tokens makes it a ring of each sequence's last L
        tokens for a windowed layer (window None: the layer's; L at least the window): memory
        that does not grow with the sequence (iha_kv_cache_create_with)."""
        return KVCache(self, batch, max_tokens, storage or self.storage, cache_tokens=cache_tokens,
                       window=self.options.window if window is None else window)


def forward(x, wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, *, mask="causal", window=0, rope_base=None, scale=None,
            storage="float32", context=None):
    """One IHA layer (iha_forward) on host arrays: returns z [B,N,D] float32. See Layer for
    the options; for repeated calls with the same weights, a Layer uploads them once."""
    layer = Layer(wq, wk, wv, wo, alpha_q, alpha_k, alpha_v, r, mask=mask, window=window, rope_base=rope_base,
                  scale=scale, storage=storage, context=context, _copy=False)
    return layer.forward(x)


class KVCache:
    """The pseudo-key and pseudo-value cache of one layer for incremental decoding
    (iha_kv_cache_*, iha_decode_step): prefill() appends a chunk of tokens per sequence, step()
    one token per sequence, and both return the new tokens' outputs, equal (within rounding) to
    the rows of a full forward over everything appended so far.

    storage: "float32" or "float16" for the keys and values. cache_tokens: 0 (or at least
    max_tokens) keeps every token; L below max_tokens keeps a ring of each sequence's last L
    tokens, for steps with a window of 1 to `window` tokens (window <= L), so sequences grow to
    max_tokens in memory that depends only on L (nbytes); truncate() then rewinds only within
    what the ring holds (include/iha.h, iha_kv_cache_create_with)."""

    def __init__(self, layer, batch, max_tokens, storage="float32", *, cache_tokens=0, window=0):
        self.layer = layer
        self.context = layer.context
        self.batch, self.max_tokens = int(batch), int(max_tokens)
        self.cache_tokens, self.window = int(cache_tokens), int(window)
        _calls.dtype_of(storage)
        if self.cache_tokens < 0:
            raise ValueError(f"cache_tokens must be at least 0, not {self.cache_tokens}")
        shape = _lib.Shape(self.batch, self.max_tokens, layer.model_dim, layer.heads, layer.head_dim, layer.pseudo)
        options = _lib.KVCacheOptions()
        lib.iha_kv_cache_options_init(ctypes.byref(options))
        options.storage = _lib.STORAGES[storage]
        options.window = self.window
        options.cache_tokens = self.cache_tokens
        handle = ctypes.c_void_p()
        with self.context.lock:
            self.context.check(lib.iha_kv_cache_create_with(self.context.handle, ctypes.byref(shape),
                                                            ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

    @property
    def is_ring(self):
        """True when the cache keeps only each sequence's last cache_tokens tokens."""
        return 0 < self.cache_tokens < self.max_tokens

    def _run(self, x, counts):
        layer = self.layer
        x = _calls.host(x, layer.dtype, "x")
        if x.ndim != 3 or x.shape[0] != self.batch or x.shape[2] != layer.model_dim:
            raise ValueError(f"x must be [{self.batch}, k, {layer.model_dim}], not {tuple(x.shape)}")
        shape = _lib.Shape(self.batch, x.shape[1], layer.model_dim, layer.heads, layer.head_dim, layer.pseudo)
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
                                                   ctypes.byref(layer.options), ctypes.byref(layer._uploaded[1]),
                                                   count_array, x_buffer.buffer(), z_buffer.buffer()))
            self.context.finish()
            _opencl.finish_output(self.context, z_buffer)
        return _calls.to_float32(z)

    def prefill(self, x, counts=None):
        """Appends x [B,k,D] (sequence b: its first counts[b] rows; counts None: all k) and
        returns their outputs [B,k,D] (rows past counts[b] are 0)."""
        return self._run(x, counts)

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
