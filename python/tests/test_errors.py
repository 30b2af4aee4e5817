"""Failures become Python exceptions that carry the library's message."""

import pytest
import torch

import iha
import iha.torch
from iha import _lib
import reference


def test_every_status_has_its_exception():
    for status, cls in _lib.ERRORS.items():
        name = _lib.status_name(status)
        assert name.startswith("IHA_ERROR_"), status
        error = _lib.error(status, "")
        assert type(error) is cls and error.name == name and str(error)
        family = {"INVALID_ARGUMENT": ValueError, "SIZE_OVERFLOW": ValueError, "BUFFER_TOO_SMALL": ValueError,
                  "HOST_MEMORY": MemoryError, "DEVICE_MEMORY": MemoryError, "IO": OSError}
        assert isinstance(error, family.get(name[len("IHA_ERROR_"):], RuntimeError)), name
    assert _lib.status_name(-13) == "IHA_STATUS_UNKNOWN"  # the table covers the whole map


def layer_arrays(P=2, d=4, seed=0):
    x, weights = reference.random_layer(1, 4, 8, 2, d, P, seed=seed)
    return [x.numpy()] + [w.numpy() for w in weights]


def test_no_such_device():
    with pytest.raises(iha.NoDeviceError, match="no-such-device") as raised:
        iha.Context(device="no-such-device")
    assert isinstance(raised.value, RuntimeError)


def test_rotary_with_odd_head_width(context):
    with pytest.raises(iha.InvalidArgumentError) as raised:
        iha.forward(*layer_arrays(d=3), rope_base=10000.0, context=context)
    assert isinstance(raised.value, ValueError)
    assert raised.value.status == -1 and "rot" in str(raised.value).lower()


def test_library_refuses_negative_window(context):
    with pytest.raises(ValueError) as raised:
        iha.forward(*layer_arrays(), window=-1, context=context)
    assert "window" in str(raised.value)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.__setitem__(0, a[0][0]), "x must have 3 dimensions"),
    (lambda a: a.__setitem__(2, a[2][:-1]), "wk must have shape"),
    (lambda a: a.__setitem__(8, a[8][:, :, :1]), "r must have shape"),
    (lambda a: a.__setitem__(1, a[1][:, :-1]), "not a multiple of H"),
    (lambda a: a.__setitem__(0, a[0][:, :0]), "empty"),
])
def test_shape_errors(context, change, match):
    arrays = layer_arrays()
    change(arrays)
    with pytest.raises(ValueError, match=match):
        iha.forward(*arrays, context=context)


def test_bad_options(context):
    with pytest.raises(ValueError, match="mask"):
        iha.forward(*layer_arrays(), mask="diagonal", context=context)
    with pytest.raises(ValueError, match="storage"):
        iha.forward(*layer_arrays(), storage="int8", context=context)


def test_device_memory(context):
    _, weights = reference.random_layer(1, 2, 8, 8, 64, 4, seed=1)
    layer = iha.Layer(*[w.numpy() for w in weights], context=context)
    with pytest.raises(MemoryError) as raised:
        layer.kv_cache(1, 1 << 26)
    assert isinstance(raised.value, iha.DeviceMemoryError) and str(raised.value)


def test_torch_argument_errors(context):
    arrays = [torch.from_numpy(a) for a in layer_arrays()]
    with pytest.raises(TypeError):
        iha.torch.iha_layer(arrays[0].numpy(), *arrays[1:], context=context)
    with pytest.raises(TypeError):
        iha.torch.iha_layer(arrays[0].long(), *arrays[1:], context=context)
    with pytest.raises(ValueError, match="alpha_q"):
        iha.torch.iha_layer(arrays[0], *arrays[1:5], arrays[5][0], *arrays[6:], context=context)


def test_closed_context():
    ctx = iha.Context()
    ctx.close()
    with pytest.raises(ValueError, match="closed"):
        iha.forward(*layer_arrays(), context=ctx)
    ctx.close()
