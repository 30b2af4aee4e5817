"""The NumPy API of attention alone over already mixed (and rotated) virtual sequences:
attention and attention_backward (iha_attention, iha_attention_backward), and the partial
attention of sequence parallelism (iha_attention_partial, iha_attention_partial_backward).
qt, kt, vt, o, dout are [B,H,T,d] with T = N*P and lse [B,H,T]; `pseudo` (P) gives the masks
and windows their token structure (virtual row t belongs to token t // P)."""

import numpy as np

from . import _calls, _lib
from .context import default_context


def _inputs(storage, **arrays):
    dtype = _calls.dtype_of(storage)
    return [_calls.host(array, dtype, name) for name, array in arrays.items()]


def attention(qt, kt, vt, *, pseudo=1, mask="causal", window=0, scale=None, storage="float32", seq_lens=None,
              context=None):
    """o [B,H,T,d] and lse [B,H,T] (float32 both; the natural-log sum-exp of each row's scaled
    scores) of attention over qt, kt, vt. seq_lens packs sequences of these lengths in tokens
    over the B*N tokens, as iha.Layer.forward's."""
    context = context if context is not None else default_context()
    opts = _calls.options(mask, window, None, scale, storage, seq_lens)
    qt, kt, vt = _inputs(storage, qt=qt, kt=kt, vt=vt)
    shape = _calls.attention_shape(qt, kt, vt, pseudo)
    o, lse = _calls.attention(context, shape, opts, qt, kt, vt, want_lse=True)
    return _calls.to_float32(o), lse


def attention_backward(qt, kt, vt, o, lse, dout, *, pseudo=1, mask="causal", window=0, scale=None,
                       storage="float32", seq_lens=None, out=None, accumulate=False, context=None):
    """dqt, dkt, dvt [B,H,T,d] for dout = dLoss/do, given the o and lse that attention returned
    for the same inputs and options. out: three arrays (dqt, dkt, dvt, C-contiguous of the
    storage type) to write into; accumulate=True adds into them instead of overwriting them."""
    context = context if context is not None else default_context()
    opts = _calls.with_options(_calls.options(mask, window, None, scale, storage), seq_lens, accumulate)
    qt, kt, vt, o, dout = _inputs(storage, qt=qt, kt=kt, vt=vt, o=o, dout=dout)
    lse = _calls.host(lse, np.float32, "lse")
    shape = _calls.attention_shape(qt, kt, vt, pseudo)
    for name, array in (("o", o), ("dout", dout)):
        if tuple(array.shape) != tuple(qt.shape):
            raise ValueError(f"{name} must have qt's shape {tuple(qt.shape)}, not {tuple(array.shape)}")
    if tuple(lse.shape) != tuple(qt.shape[:3]):
        raise ValueError(f"lse must be {tuple(qt.shape[:3])}, not {tuple(lse.shape)}")
    likes = [("dqt", qt), ("dkt", kt), ("dvt", vt)]
    if out is None and accumulate:
        raise ValueError("accumulate=True adds into existing gradients: pass them as out")
    outputs = _calls.gradient_arrays(likes, [True] * 3, None if out is None else list(out), accumulate)
    _calls.attention_backward(context, shape, opts, qt, kt, vt, o, lse, dout, outputs)
    return tuple(outputs) if out is not None else tuple(_calls.to_float32(g) for g in outputs)


def _block(q_offset, k_offset, k_tokens, first):
    for name, value in (("q_offset", q_offset), ("k_offset", k_offset)):
        if int(value) != value or value < 0:
            raise ValueError(f"{name} must be a token index of at least 0, not {value!r}")
    return _lib.PartialBlock(int(q_offset), int(k_offset), int(k_tokens), 1 if first else 0)


def _partial_setup(qt, kt, vt, pseudo):
    qt, kt, vt = (_calls.host(a, np.float32, n) for a, n in ((qt, "qt"), (kt, "kt"), (vt, "vt")))
    if qt.ndim != 4 or kt.ndim != 4 or tuple(kt.shape) != tuple(vt.shape) or kt.shape[:2] != qt.shape[:2] \
            or kt.shape[3] != qt.shape[3]:
        raise ValueError(f"qt [B,H,T,d] and kt, vt [B,H,Tk,d] must agree, not {tuple(qt.shape)}, "
                         f"{tuple(kt.shape)}, {tuple(vt.shape)}")
    if pseudo < 1 or kt.shape[2] % pseudo:
        raise ValueError(f"the key block's virtual length {kt.shape[2]} must be a multiple of pseudo = {pseudo}")
    shape = _calls.attention_shape(qt, qt, qt, pseudo)
    return qt, kt, vt, shape, kt.shape[2] // pseudo


def _state(array, shape, name):
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or tuple(array.shape) != tuple(shape) \
            or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous float32 array of shape {tuple(shape)}")
    return array


def attention_partial(qt, kt, vt, o=None, lse=None, *, q_offset, k_offset, first=False, pseudo=1, mask="causal",
                      window=0, scale=None, context=None):
    """One step of sequence-parallel attention: attends the query block qt (tokens q_offset ..
    of a longer sequence) over the key block kt, vt [B,H,Tk,d] (tokens k_offset ..) and merges
    the result into the running state o [B,H,T,d], lse [B,H,T] in place (online softmax).
    first=True starts the state (o and lse may then be None: new arrays). After every key block
    has been merged, in any order, o and lse are attention's over the whole sequence. Float32
    only; masks and windows are evaluated at global positions. Returns (o, lse)."""
    context = context if context is not None else default_context()
    opts = _calls.options(mask, window, None, scale, "float32")
    qt, kt, vt, shape, k_tokens = _partial_setup(qt, kt, vt, pseudo)
    if first:
        o = _calls.empty(qt.shape, np.float32) if o is None else o
        lse = _calls.empty(qt.shape[:3], np.float32) if lse is None else lse
    elif o is None or lse is None:
        raise ValueError("a step that is not the first merges into o and lse: pass them")
    o, lse = _state(o, qt.shape, "o"), _state(lse, qt.shape[:3], "lse")
    _calls.partial(context, shape, opts, _block(q_offset, k_offset, k_tokens, first), qt, kt, vt, o, lse)
    return o, lse


def attention_partial_backward(qt, kt, vt, o, lse, dout, *, q_offset, k_offset, first=False, dqt=None, dkt=None,
                               dvt=None, accumulate=False, pseudo=1, mask="causal", window=0, scale=None,
                               context=None):
    """The backward of one attention_partial step, given the FINAL o and lse of the query block
    and dout = dLoss/do: dqt gets the key block's share of dLoss/dqt (overwritten with
    first=True, else added into: sum it over the key blocks), dkt and dvt [B,H,Tk,d] the query
    block's share of dLoss/dkt, dLoss/dvt (overwritten, or added into with accumulate=True: sum
    over the query blocks). Arrays left None are made (dqt only with first=True, dkt and dvt
    only without accumulate). Returns (dqt, dkt, dvt), float32."""
    context = context if context is not None else default_context()
    opts = _calls.with_options(_calls.options(mask, window, None, scale, "float32"), None, accumulate)
    qt, kt, vt, shape, k_tokens = _partial_setup(qt, kt, vt, pseudo)
    o, dout = (_calls.host(a, np.float32, n) for a, n in ((o, "o"), (dout, "dout")))
    lse = _calls.host(lse, np.float32, "lse")
    for name, array, want in (("o", o, qt.shape), ("dout", dout, qt.shape), ("lse", lse, qt.shape[:3])):
        if tuple(array.shape) != tuple(want):
            raise ValueError(f"{name} must be {tuple(want)}, not {tuple(array.shape)}")
    if dqt is None:
        if not first:
            raise ValueError("a step that is not the first adds into dqt: pass it")
        dqt = _calls.empty(qt.shape, np.float32)
    dqt = _state(dqt, qt.shape, "dqt")
    keys = []
    for name, array in (("dkt", dkt), ("dvt", dvt)):
        if array is None:
            if accumulate:
                raise ValueError(f"accumulate=True adds into {name}: pass it")
            array = _calls.empty(kt.shape, np.float32)
        keys.append(_state(array, kt.shape, name))
    _calls.partial_backward(context, shape, opts, _block(q_offset, k_offset, k_tokens, first), qt, kt, vt, o, lse,
                            dout, dqt, *keys)
    return dqt, keys[0], keys[1]
