"""Failures become Python exceptions that carry the library's message."""

import importlib
import pkgutil

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
    (lambda a: a.__setitem__(1, a[1][:, :-2]), "wq must have shape"),  # still a multiple of H
    (lambda a: a.__setitem__(5, a[5][:, :, :1]), "alpha_q must have shape"),
    (lambda a: a.__setitem__(7, a[7][:1]), "alpha_v must have shape"),
    (lambda a: a.__setitem__(4, a[4][:-1]), "wo must have shape"),
    (lambda a: a.__setitem__(0, a[0][:, :, :-1]), "x must have shape"),
    (lambda a: a.__setitem__(slice(1, 5), [w[:, :-1] for w in a[1:4]] + [a[4][:-1]]), "not a multiple of H"),
    (lambda a: a.__setitem__(0, a[0][:, :0]), "empty"),
])
def test_shape_errors(context, change, match):
    arrays = layer_arrays()
    change(arrays)
    with pytest.raises(ValueError, match=match):
        iha.forward(*arrays, context=context)


@pytest.mark.parametrize("index,value,match", [
    (0, None, "x must be an array"),
    (3, None, "wv must be an array"),
    (0, "text", "x must be an array of real numbers"),
    (6, lambda a: a + 1j, "alpha_k is complex"),
])
def test_argument_types(context, index, value, match):
    arrays = layer_arrays()
    arrays[index] = value(arrays[index]) if callable(value) else value
    with pytest.raises(TypeError, match=match):
        iha.forward(*arrays, context=context)
    if index:
        with pytest.raises(TypeError, match=match):
            iha.Layer(*arrays[1:], context=context)


def test_layer_names_the_weight_at_fault(context):
    arrays = layer_arrays()
    arrays[2] = arrays[2][:, :-2]
    with pytest.raises(ValueError, match="wk must have shape"):
        iha.Layer(*arrays[1:], context=context)


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


@pytest.mark.parametrize("argument", ["model_dim", "heads", "head_dim", "pseudo"])
@pytest.mark.parametrize("value", [0, -1, 2.5, "4"])
def test_module_arguments(argument, value):
    sizes = dict(model_dim=8, heads=2, head_dim=4, pseudo=2)
    sizes[argument] = value
    with pytest.raises(ValueError, match=argument):
        iha.torch.InterleavedHeadAttention(**sizes)


def test_no_second_derivative(context):
    arrays = [torch.from_numpy(a).requires_grad_() for a in layer_arrays()]
    z = iha.torch.iha_layer(*arrays, context=context)
    with pytest.raises(RuntimeError, match="iha_layer has no second derivative"):
        torch.autograd.grad(z.square().sum(), arrays[0], create_graph=True)
    qt = torch.rand(1, 2, 8, 4, requires_grad=True)
    o = iha.torch.attention(qt, qt, qt, pseudo=2, context=context)
    with pytest.raises(RuntimeError, match="attention has no second derivative"):
        torch.autograd.grad(o.sum(), qt, create_graph=True)
    # The first derivative alone is as before.
    (grad,) = torch.autograd.grad(iha.torch.iha_layer(*arrays, context=context).sum(), arrays[0])
    assert grad.shape == arrays[0].shape


def test_torch_complex_input(context):
    arrays = [torch.from_numpy(a) for a in layer_arrays()]
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        iha.torch.iha_layer(arrays[0].to(torch.complex64), *arrays[1:], context=context)


def test_every_listed_submodule_imports():
    """help(iha) lists what pkgutil finds in the package: each must be a module that imports."""
    names = [m.name for m in pkgutil.iter_modules(iha.__path__)]
    assert "layer" in names
    for name in names:
        importlib.import_module(f"iha.{name}")


def test_closed_context():
    ctx = iha.Context()
    ctx.close()
    with pytest.raises(ValueError, match="closed"):
        iha.forward(*layer_arrays(), context=ctx)
    ctx.close()
