"""The library's layer and attention calls on host arrays: shape checks against doc/spec.md's
layouts, options, device buffers, the call, and the outputs back in host arrays. The NumPy API
(layer.py) and the PyTorch API (torch.py) both go through here."""

import ctypes
import math

import numpy as np

from . import _lib, _opencl
from ._lib import lib

WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r")
# Host arrays handed to a device in place are allocated on this boundary (a cache line or
# more on every device PoCL and the GPUs' drivers know), so a driver never needs a copy for
# alignment's sake.
_ALIGNMENT = 128
# bfloat16 has no NumPy type: host arrays of bfloat16 storage hold its bit patterns in this
# structured 2-byte type, which no arithmetic takes by mistake; host() and to_float32() convert
# through the library (round to nearest even, bit-exact with the device).
BFLOAT16 = np.dtype([("bfloat16", "<u2")])


def empty(shape, dtype):
    """An uninitialised C-contiguous array aligned to _ALIGNMENT bytes."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    raw = np.empty(count * dtype.itemsize + _ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def dtype_of(storage):
    if storage not in _lib.STORAGES:
        raise ValueError(f"storage must be one of {sorted(_lib.STORAGES)}, not {storage!r}")
    return {"float16": np.dtype(np.float16), "bfloat16": BFLOAT16}.get(storage, np.dtype(np.float32))


def host(array, dtype, name):
    """A C-contiguous array of dtype with `array`'s values (the array itself when it already is).
    Only real numbers are taken: NumPy would turn None into a one-element array and drop the
    imaginary part of a complex one with a mere warning."""
    if array is None:
        raise TypeError(f"{name} must be an array of real numbers, not None")
    source = np.asarray(array)
    if source.dtype.kind == "c":
        raise TypeError(f"{name} is complex ({source.dtype}): iha computes on real numbers; pass its .real "
                        "part if that is what is meant")
    if source.dtype != BFLOAT16 and source.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be an array of real numbers, not of {source.dtype}")
    if np.dtype(dtype) == BFLOAT16 and source.dtype != BFLOAT16:
        floats = np.ascontiguousarray(array, dtype=np.float32)
        result = empty(floats.shape, BFLOAT16)
        lib.iha_bf16_from_float(floats.ctypes.data, result.ctypes.data, floats.size)
    else:
        result = np.ascontiguousarray(array, dtype=dtype)
    if result.size == 0:
        raise ValueError(f"{name} is empty (shape {result.shape}): every dimension must be at least 1")
    return result


def to_float32(array):
    """The values of a host array of any storage type as float32 (the array itself when it is)."""
    if array.dtype != BFLOAT16:
        return array.astype(np.float32, copy=False)
    result = empty(array.shape, np.float32)
    lib.iha_bf16_to_float(array.ctypes.data, result.ctypes.data, array.size)
    return result


def options(mask="causal", window=0, rope_base=None, scale=None, storage="float32", seq_lens=None):
    """An iha_attention_options; rope_base None leaves rotary off, scale None is 1/sqrt(d).
    storage applies to the activations and the weights alike; seq_lens (None: one sequence per
    batch row) packs sequences of these lengths in tokens into the call's batch rows."""
    result = _lib.AttentionOptions()
    lib.iha_attention_options_init(ctypes.byref(result))
    if mask not in _lib.MASKS:
        raise ValueError(f"mask must be one of {sorted(_lib.MASKS)}, not {mask!r}")
    if int(window) != window:
        raise ValueError(f"window must be an integer number of tokens, not {window!r}")
    dtype_of(storage)
    result.mask = _lib.MASKS[mask]
    result.window = int(window)
    result.scale = 0.0 if scale is None else float(scale)
    result.rope = 0 if rope_base is None else 1
    result.rope_base = 0.0 if rope_base is None else float(rope_base)
    result.storage = result.weight_storage = _lib.STORAGES[storage]
    return with_options(result, seq_lens)


def sequence_lengths(seq_lens):
    """seq_lens as a list of ints (None stays None); the library checks their sum and bounds."""
    if seq_lens is None:
        return None
    lengths = [int(n) for n in np.asarray(seq_lens).reshape(-1)]
    if not lengths:
        raise ValueError("seq_lens is empty: give at least one length, or None for one sequence per batch row")
    if any(n < 0 for n in lengths) or any(n != v for n, v in zip(lengths, np.asarray(seq_lens).reshape(-1))):
        raise ValueError(f"seq_lens must be whole numbers of tokens, not {list(np.asarray(seq_lens).reshape(-1))}")
    return lengths


def with_options(opts, seq_lens=None, accumulate=False):
    """A copy of an iha_attention_options with packed sequence lengths (None: none) and the
    accumulate flag set. The copy keeps its lengths array alive."""
    result = _lib.AttentionOptions.from_buffer_copy(opts)
    lengths = sequence_lengths(seq_lens)
    if lengths is None:
        result.seq_lens, result.seq_count = None, 0
    else:
        result.seq_lens = (ctypes.c_size_t * len(lengths))(*lengths)
        result.seq_count = len(lengths)
    result.accumulate = 1 if accumulate else 0
    return result


def _dims(array, rank, name):
    if array.ndim != rank:
        raise ValueError(f"{name} must have {rank} dimensions, not shape {tuple(array.shape)}")
    return array.shape


def _agreed(holders):
    """The size that most of holders, (argument name, its size) pairs, give (the first one's in
    a tie): one argument that disagrees with the others is the one named as wrong."""
    sizes = [size for _, size in holders]
    return max(sizes, key=lambda size: (sizes.count(size), -sizes.index(size)))


def _check_shapes(arrays, expected, context):
    for name, array in arrays.items():
        if tuple(array.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]} {context}; it has {tuple(array.shape)}")


MIXING_NAMES = WEIGHT_NAMES[4:]


def mixing_shape(mixing):
    """H and P of the four mixing and collapse weights [H,H,P], each checked by name: H and P
    are those most of them agree on."""
    arrays = dict(zip(MIXING_NAMES, mixing))
    for name, array in arrays.items():
        _dims(array, 3, name)
    heads = _agreed([(n, a.shape[i]) for n, a in arrays.items() for i in (0, 1)])
    pseudo = _agreed([(n, a.shape[2]) for n, a in arrays.items()])
    _check_shapes(arrays, {name: (heads, heads, pseudo) for name in arrays}, f"for H = {heads}, P = {pseudo}")
    return heads, pseudo


def weights_shape(weights):
    """(D, H, d, P) of a layer's eight weights, each checked by name before any size is read
    from another: D and H*d are what most of the projections agree on, H and P what most of the
    mixing weights do."""
    projections = dict(zip(WEIGHT_NAMES[:4], weights[:4]))
    for name, array in projections.items():
        _dims(array, 2, name)
    heads, pseudo = mixing_shape(weights[4:])
    model_dim = _agreed([(n, a.shape[0]) for n, a in projections.items() if n != "wo"] +
                        [("wo", projections["wo"].shape[1])])
    inner = _agreed([(n, a.shape[1]) for n, a in projections.items() if n != "wo"] +
                    [("wo", projections["wo"].shape[0])])
    expected = {"wq": (model_dim, inner), "wk": (model_dim, inner), "wv": (model_dim, inner),
                "wo": (inner, model_dim)}
    _check_shapes(projections, expected, f"for D = {model_dim}, H*d = {inner}")
    if inner % heads:
        raise ValueError(f"wq, wk and wv have {inner} columns, not a multiple of H = {heads} (alpha_q's first size)")
    return model_dim, heads, inner // heads, pseudo


def layer_shape(x, weights):
    """The iha_shape of a layer from x [B,N,D] and the eight weights (checked against each other)."""
    batch, tokens, model_dim = _dims(x, 3, "x")
    weight_dim, heads, head_dim, pseudo = weights_shape(weights)
    if model_dim != weight_dim:
        raise ValueError(f"x must have shape ({batch}, {tokens}, {weight_dim}) for weights of D = {weight_dim}; "
                         f"it has {tuple(x.shape)}")
    return _lib.Shape(batch, tokens, model_dim, heads, head_dim, pseudo)


def attention_shape(qt, kt, vt, pseudo):
    """The iha_shape of an attention call from qt, kt, vt [B,H,T,d] with T = N*P."""
    shape = _dims(qt, 4, "qt")
    for name, array in (("kt", kt), ("vt", vt)):
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{name} must have qt's shape {tuple(shape)}, not {tuple(array.shape)}")
    batch, heads, length, head_dim = shape
    if pseudo < 1 or length % pseudo:
        raise ValueError(f"the virtual length T = {length} must be a multiple of pseudo = {pseudo}")
    return _lib.Shape(batch, length // pseudo, 1, heads, head_dim, pseudo)


def upload_weights(context, weights):
    """Device buffers of the eight weights (host arrays of the weight storage type) and the
    iha_layer_weights that names them."""
    buffers = [_opencl.input_buffer(context, array) for array in weights]
    return buffers, _lib.LayerWeights(*(b.buffer() for b in buffers))


def upload_mixing(context, mixing):
    """upload_weights for the core calls: the four mixing weights only (the projections' slots
    are empty, as the core calls ignore them)."""
    buffers = [_opencl.input_buffer(context, array) for array in mixing]
    return buffers, _lib.LayerWeights(*([_null()] * 4), *(b.buffer() for b in buffers))


def _null():
    return _lib.Buffer(None, 0)


def forward(context, shape, opts, uploaded, x, save=False):
    """iha_forward (save=False) or iha_forward_save with the weights of upload_weights: returns
    z in the activation storage type and, when saving, the device buffer of the saved state."""
    z = empty((shape.batch, shape.tokens, shape.model_dim), x.dtype)
    _, weight_struct = uploaded
    with context.lock:
        x_buffer = _opencl.input_buffer(context, x)
        z_buffer = _opencl.output_buffer(context, z)
        saved = None
        if save:
            elements = ctypes.c_size_t(0)
            context.check(lib.iha_saved_elements(context.handle, ctypes.byref(shape), ctypes.byref(elements)))
            saved = _opencl.scratch_buffer(context, elements.value * 4)
            context.check(lib.iha_forward_save(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                               ctypes.byref(weight_struct), x_buffer.buffer(), z_buffer.buffer(),
                                               saved.buffer()))
        else:
            context.check(lib.iha_forward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                          ctypes.byref(weight_struct), x_buffer.buffer(), z_buffer.buffer()))
        context.finish()
        _opencl.finish_output(context, z_buffer)
    return z, saved


def _gradient_buffers(context, outputs, accumulate):
    """Device tensors of the gradient arrays (None where not asked for): each starts with its
    array's values when the call adds into it."""
    make = _opencl.inout_buffer if accumulate else _opencl.output_buffer
    return [make(context, array) if array is not None else None for array in outputs]


def _finish(context, buffers):
    context.finish()
    for b in buffers:
        if b:
            _opencl.finish_output(context, b)


def gradient_arrays(likes, wanted, given=None, accumulate=False):
    """The output arrays of a backward call: given[i] where the caller passed one (checked
    against likes[i]'s shape and storage type; it is added into with accumulate), a new array
    where wanted[i] asks for one, else None."""
    given = given or [None] * len(likes)
    result = []
    for (name, like), want, array in zip(likes, wanted, given):
        if array is None:
            if accumulate and want:
                raise ValueError(f"accumulate=True adds into given gradients: pass the array for {name}")
            result.append(empty(like.shape, like.dtype) if want else None)
            continue
        if not isinstance(array, np.ndarray) or array.dtype != like.dtype or tuple(array.shape) != tuple(like.shape) \
                or not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"the gradient array for {name} must be a writeable C-contiguous {like.dtype} array of "
                             f"shape {tuple(like.shape)}, not {getattr(array, 'dtype', type(array))} "
                             f"{tuple(getattr(array, 'shape', ()))}")
        result.append(array)
    return result


def backward_saved(context, shape, opts, uploaded, x, saved, dz, wanted):
    """iha_backward_saved with the forward's uploaded weights and saved state: wanted[0] asks
    for dx, wanted[1:9] for the weights' gradients (in WEIGHT_NAMES order). Returns nine arrays
    or None, in the storage types of x and the weights."""
    buffers, _ = uploaded
    likes = [("x", x)] + [(n, b.array) for n, b in zip(WEIGHT_NAMES, buffers)]
    return backward(context, shape, opts, uploaded, x, dz, gradient_arrays(likes, wanted), saved=saved)


def backward(context, shape, opts, uploaded, x, dz, outputs, saved=None):
    """iha_backward (iha_backward_saved with a saved state) into outputs: nine arrays (dx and
    the weights' gradients in WEIGHT_NAMES order) or None for those not computed; with
    opts.accumulate the call adds into them. Returns outputs."""
    _, weight_struct = uploaded
    with context.lock:
        x_buffer = _opencl.input_buffer(context, x)
        dz_buffer = _opencl.input_buffer(context, dz)
        out_buffers = _gradient_buffers(context, outputs, opts.accumulate)
        grads = _lib.LayerGrads(*((b.buffer() if b else _null()) for b in out_buffers[1:]))
        dx = out_buffers[0].buffer() if out_buffers[0] else _null()
        if saved is not None:
            status = lib.iha_backward_saved(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                            ctypes.byref(weight_struct), x_buffer.buffer(), saved.buffer(),
                                            dz_buffer.buffer(), dx, ctypes.byref(grads))
        else:
            status = lib.iha_backward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                      ctypes.byref(weight_struct), x_buffer.buffer(), dz_buffer.buffer(), dx,
                                      ctypes.byref(grads))
        context.check(status)
        _finish(context, out_buffers)
    return outputs


def core_shape(q, k, v, weights):
    """The iha_shape of a core call from q, k, v [B,N,H,d] and the mixing weights [H,H,P]."""
    shape = _dims(q, 4, "q")
    for name, array in (("k", k), ("v", v)):
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{name} must have q's shape {tuple(shape)}, not {tuple(array.shape)}")
    batch, tokens, heads, head_dim = shape
    heads2, pseudo = mixing_shape(weights[4:])
    if heads2 != heads:
        raise ValueError(f"q has {heads} heads but the mixing weights are [{heads2},{heads2},{pseudo}]")
    return _lib.Shape(batch, tokens, 1, heads, head_dim, pseudo)


def core(context, shape, opts, uploaded, q, k, v):
    """iha_attention_core: returns y [B,N,H,d] in q's storage type."""
    y = empty(q.shape, q.dtype)
    _, weight_struct = uploaded
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (q, k, v)]
        y_buffer = _opencl.output_buffer(context, y)
        context.check(lib.iha_attention_core(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                             ctypes.byref(weight_struct), *(b.buffer() for b in ins), y_buffer.buffer()))
        _finish(context, [y_buffer])
    return y


def core_backward(context, shape, opts, uploaded, q, k, v, dy, outputs):
    """iha_attention_core_backward into outputs: seven arrays (dq, dk, dv and the gradients of
    alpha_q, alpha_k, alpha_v, r) or None; with opts.accumulate the call adds into them."""
    _, weight_struct = uploaded
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (q, k, v, dy)]
        out_buffers = _gradient_buffers(context, outputs, opts.accumulate)
        grads = _lib.LayerGrads(_null(), _null(), _null(), _null(),
                                *((b.buffer() if b else _null()) for b in out_buffers[3:]))
        context.check(lib.iha_attention_core_backward(
            context.handle, ctypes.byref(shape), ctypes.byref(opts), ctypes.byref(weight_struct),
            *(b.buffer() for b in ins), *((b.buffer() if b else _null()) for b in out_buffers[:3]),
            ctypes.byref(grads)))
        _finish(context, out_buffers)
    return outputs


def stage_shape(o, x_like, weights):
    """The iha_shape of a layer stage from a virtual-sequence array o [B,H,N*P,d] (checked
    against the weights) and, when given, an x-shaped array [B,N,D] that must agree with it."""
    batch, heads, length, head_dim = _dims(o, 4, "o")
    heads2, _, pseudo = weights[4].shape
    model_dim, columns = weights[0].shape
    if heads != heads2 or head_dim * heads != columns or length % pseudo:
        raise ValueError(f"the virtual sequence must be [B, H = {heads2}, N*P (P = {pseudo}), "
                         f"d = {columns // heads2}], not {tuple(o.shape)}")
    shape = _lib.Shape(batch, length // pseudo, model_dim, heads, head_dim, pseudo)
    if x_like is not None:
        name, array = x_like
        want = (batch, shape.tokens, model_dim)
        if tuple(array.shape) != want:
            raise ValueError(f"{name} must be {want} for the virtual sequence {tuple(o.shape)}, "
                             f"not {tuple(array.shape)}")
    return shape


def first_token(value):
    """A run's first token as the size_t the stage calls take."""
    if int(value) != value or not 0 <= value < 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)):
        raise ValueError(f"first_token must be a token index of at least 0, not {value!r}")
    return int(value)


def expand(context, shape, opts, uploaded, first, x):
    """iha_layer_expand: returns qt, kt, vt [B,H,N*P,d] in x's storage type."""
    rows = (shape.batch, shape.heads, shape.tokens * shape.pseudo, shape.head_dim)
    outputs = [empty(rows, x.dtype) for _ in range(3)]
    _, weight_struct = uploaded
    with context.lock:
        x_buffer = _opencl.input_buffer(context, x)
        out_buffers = [_opencl.output_buffer(context, a) for a in outputs]
        context.check(lib.iha_layer_expand(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                           ctypes.byref(weight_struct), first, x_buffer.buffer(),
                                           *(b.buffer() for b in out_buffers)))
        _finish(context, out_buffers)
    return outputs


def collapse(context, shape, opts, uploaded, o):
    """iha_layer_collapse: returns z [B,N,D] in o's storage type."""
    z = empty((shape.batch, shape.tokens, shape.model_dim), o.dtype)
    _, weight_struct = uploaded
    with context.lock:
        o_buffer = _opencl.input_buffer(context, o)
        z_buffer = _opencl.output_buffer(context, z)
        context.check(lib.iha_layer_collapse(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                             ctypes.byref(weight_struct), o_buffer.buffer(), z_buffer.buffer()))
        _finish(context, [z_buffer])
    return z


def collapse_backward(context, shape, opts, uploaded, o, dz, outputs):
    """iha_layer_collapse_backward into outputs: three arrays (dout and the gradients of wo
    and r) or None; with opts.accumulate the call adds into them."""
    _, weight_struct = uploaded
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (o, dz)]
        out_buffers = _gradient_buffers(context, outputs, opts.accumulate)
        wo, r = ((b.buffer() if b else _null()) for b in out_buffers[1:])
        grads = _lib.LayerGrads(_null(), _null(), _null(), wo, _null(), _null(), _null(), r)
        dout = out_buffers[0].buffer() if out_buffers[0] else _null()
        context.check(lib.iha_layer_collapse_backward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                                      ctypes.byref(weight_struct), *(b.buffer() for b in ins), dout,
                                                      ctypes.byref(grads)))
        _finish(context, out_buffers)
    return outputs


def expand_backward(context, shape, opts, uploaded, first, x, dqt, dkt, dvt, outputs):
    """iha_layer_expand_backward into outputs: seven arrays (dx and the gradients of wq, wk,
    wv, alpha_q, alpha_k, alpha_v) or None; with opts.accumulate the call adds into them."""
    _, weight_struct = uploaded
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (x, dqt, dkt, dvt)]
        out_buffers = _gradient_buffers(context, outputs, opts.accumulate)
        wq, wk, wv, aq, ak, av = ((b.buffer() if b else _null()) for b in out_buffers[1:])
        grads = _lib.LayerGrads(wq, wk, wv, _null(), aq, ak, av, _null())
        dx = out_buffers[0].buffer() if out_buffers[0] else _null()
        context.check(lib.iha_layer_expand_backward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                                    ctypes.byref(weight_struct), first, *(b.buffer() for b in ins),
                                                    dx, ctypes.byref(grads)))
        _finish(context, out_buffers)
    return outputs


def attention(context, shape, opts, qt, kt, vt, want_lse):
    """iha_attention: returns o (qt's storage type) and lse (float32) or None."""
    o = empty(qt.shape, qt.dtype)
    lse = empty(qt.shape[:3], np.float32) if want_lse else None
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (qt, kt, vt)]
        o_buffer = _opencl.output_buffer(context, o)
        lse_buffer = _opencl.output_buffer(context, lse) if want_lse else None
        context.check(lib.iha_attention(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                        *(b.buffer() for b in ins), o_buffer.buffer(),
                                        lse_buffer.buffer() if lse_buffer else _null()))
        context.finish()
        _opencl.finish_output(context, o_buffer)
        if lse_buffer:
            _opencl.finish_output(context, lse_buffer)
    return o, lse


def attention_backward(context, shape, opts, qt, kt, vt, o, lse, dout, outputs=None):
    """iha_attention_backward: returns dqt, dkt, dvt in qt's storage type (into outputs when
    given, added into them with opts.accumulate)."""
    grads = outputs if outputs is not None else [empty(qt.shape, qt.dtype) for _ in range(3)]
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (qt, kt, vt, o, lse, dout)]
        outs = _gradient_buffers(context, grads, opts.accumulate)
        context.check(lib.iha_attention_backward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                                 *(b.buffer() for b in ins), *(b.buffer() for b in outs)))
        _finish(context, outs)
    return grads


def partial(context, shape, opts, block, qt, kt, vt, o, lse):
    """iha_attention_partial: merges the key block into the running state o, lse in place."""
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (qt, kt, vt)]
        make = _opencl.output_buffer if block.first else _opencl.inout_buffer
        states = [make(context, a) for a in (o, lse)]
        context.check(lib.iha_attention_partial(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                                ctypes.byref(block), *(b.buffer() for b in ins),
                                                *(b.buffer() for b in states)))
        _finish(context, states)


def partial_backward(context, shape, opts, block, qt, kt, vt, o, lse, dout, dqt, dkt, dvt):
    """iha_attention_partial_backward into dqt (overwritten with block.first, else added into)
    and dkt, dvt (added into with opts.accumulate)."""
    with context.lock:
        ins = [_opencl.input_buffer(context, a) for a in (qt, kt, vt, o, lse, dout)]
        outs = [(_opencl.output_buffer if block.first else _opencl.inout_buffer)(context, dqt)]
        outs += _gradient_buffers(context, [dkt, dvt], opts.accumulate)
        context.check(lib.iha_attention_partial_backward(context.handle, ctypes.byref(shape), ctypes.byref(opts),
                                                         ctypes.byref(block), *(b.buffer() for b in ins),
                                                         *(b.buffer() for b in outs)))
        _finish(context, outs)
