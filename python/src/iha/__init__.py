"""Interleaved Head Attention on OpenCL (Duvvuri et al., arXiv 2602.21371).

NumPy API: devices(), Context, forward(), Layer (forward, backward, core, core_backward, and the
stages expand, collapse, collapse_backward, expand_backward), KVCache, attention(),
attention_backward(), attention_partial(), attention_partial_backward(). PyTorch API: iha.torch
(import it separately; it needs torch). doc/python.md is the manual; doc/spec.md defines the computation.
"""

from ._lib import (BufferTooSmallError, BuildError, DeviceMemoryError, Error, GemmError, HostMemoryError, IOFailure,
                   InvalidArgumentError, NoDeviceError, OpenCLError, ProfileError, SizeOverflowError,
                   UnsupportedError)
from ._lib import lib as _library
from ._calls import BFLOAT16
from .context import Context, Device, default_context, devices
from .functions import attention, attention_backward, attention_partial, attention_partial_backward
from .layer import KVCache, Layer, forward

__version__ = _library.iha_version_string().decode()

__all__ = ["BFLOAT16", "BufferTooSmallError", "BuildError", "Context", "Device", "DeviceMemoryError", "Error", "GemmError",
           "HostMemoryError", "InvalidArgumentError", "IOFailure", "KVCache", "Layer", "NoDeviceError",
           "OpenCLError", "ProfileError", "SizeOverflowError", "UnsupportedError", "attention", "attention_backward",
           "attention_partial", "attention_partial_backward", "default_context", "devices", "forward"]
