"""Devices and contexts: iha.devices() lists what iha_devices_list sees, iha.Context owns one
iha_context (device, queue, compiled kernels, workspace)."""

import atexit
import ctypes
import os
import threading
from dataclasses import dataclass

from . import _lib, _opencl
from ._lib import lib


@dataclass(frozen=True)
class Device:
    """One OpenCL device as iha_devices_list reports it; `selector` ("P:D") is what
    Context(device=...) and IHA_DEVICE accept to pick it."""

    selector: str
    platform_name: str
    platform_version: str
    name: str
    vendor: str
    driver_version: str
    device_version: str
    is_gpu: bool
    is_cpu: bool
    has_fp16: bool
    compute_units: int
    global_mem_bytes: int
    max_alloc_bytes: int
    local_mem_bytes: int


def devices():
    """Every OpenCL device on every platform, as a list of Device."""
    count = ctypes.c_size_t(0)
    status = lib.iha_devices_list(None, 0, ctypes.byref(count))
    if status != 0:
        raise _lib.error(status, "")
    infos = (_lib.DeviceInfo * max(count.value, 1))()
    status = lib.iha_devices_list(infos, count.value, ctypes.byref(count))
    if status != 0:
        raise _lib.error(status, "")
    return [
        Device(
            selector=f"{i.platform_index}:{i.device_index}",
            platform_name=i.platform_name.decode(errors="replace"),
            platform_version=i.platform_version.decode(errors="replace"),
            name=i.device_name.decode(errors="replace"),
            vendor=i.device_vendor.decode(errors="replace"),
            driver_version=i.driver_version.decode(errors="replace"),
            device_version=i.device_version.decode(errors="replace"),
            is_gpu=bool(i.is_gpu),
            is_cpu=bool(i.is_cpu),
            has_fp16=bool(i.has_fp16),
            compute_units=i.compute_units,
            global_mem_bytes=i.global_mem_bytes,
            max_alloc_bytes=i.max_alloc_bytes,
            local_mem_bytes=i.local_mem_bytes,
        )
        for i in infos[: count.value]
    ]


def _host_pointers_from_environment():
    value = os.environ.get("IHA_PYTHON_HOST_POINTERS", "").strip().lower()
    if value in ("1", "on", "yes", "true"):
        return True
    if value in ("0", "off", "no", "false"):
        return False
    return None


class Context:
    """An iha_context on one device.

    device: "P:D" (see devices()), or a case-insensitive substring of the platform or device
        name ("pocl", "nvidia", "cpu", "gpu"); None: $IHA_DEVICE, else the first GPU, else the
        first device.
    cache_dir, profile: as iha_context_options (None: the library's defaults).
    host_pointers: True hands host arrays to the device in place (CL_MEM_USE_HOST_PTR), False
        copies them to device buffers and back; None (the default) takes
        $IHA_PYTHON_HOST_POINTERS, else in place exactly when the device shares host memory
        (CPU drivers such as PoCL). doc/python.md compares the two.

    Calls on one context are serialised by a lock, so threads may share it. Create one and
    keep it: a context compiles its kernels on first use (from the disk cache when it can).
    """

    def __init__(self, device=None, *, cache_dir=None, profile=None, host_pointers=None):
        options = _lib.ContextOptions()
        lib.iha_context_options_init(ctypes.byref(options))
        keep = []
        for field, value in (("device", device), ("cache_dir", cache_dir), ("profile", profile)):
            if value is not None:
                encoded = str(value).encode()
                keep.append(encoded)
                setattr(options, field, encoded)
        handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(1024)
        status = lib.iha_context_create(ctypes.byref(handle), ctypes.byref(options), message, len(message))
        if status != 0:
            raise _lib.error(status, message.value.decode(errors="replace"))
        self._handle = handle
        self.lock = threading.RLock()
        self._cl_context = lib.iha_context_cl_context(handle)
        self._cl_queue = lib.iha_context_cl_queue(handle)
        self.unified_memory = _opencl.host_unified_memory(lib.iha_context_cl_device(handle))
        if host_pointers is None:
            host_pointers = _host_pointers_from_environment()
        self.host_pointers = self.unified_memory if host_pointers is None else bool(host_pointers)

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("the context is closed")
        return self._handle

    def _opened(self, value):
        """value, once the context is known to be open (its OpenCL objects die with it)."""
        if self._handle is None:
            raise ValueError("the context is closed")
        return value

    @property
    def cl_context(self):
        """The context's cl_context (owned by the library: valid while the context is open)."""
        return self._opened(self._cl_context)

    @property
    def cl_queue(self):
        """The context's in-order cl_command_queue (owned by the library)."""
        return self._opened(self._cl_queue)

    @property
    def device_name(self):
        return lib.iha_context_device_name(self.handle).decode(errors="replace")

    def check(self, status):
        """Raises the exception for a failed call on this context, with its message."""
        if status != 0:
            raise _lib.error(status, lib.iha_context_message(self.handle).decode(errors="replace"))

    def finish(self):
        self.check(lib.iha_context_finish(self.handle))

    def trim(self):
        """Releases the context's workspace buffers (they grow on demand) and writes the programs it
        built so far to the disk cache, for later processes (closing the context does too)."""
        with self.lock:
            lib.iha_context_trim(self.handle)

    def close(self):
        """Frees the context now (also done when it is garbage-collected)."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            lib.iha_context_free(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def __repr__(self):
        state = "closed" if self._handle is None else self.device_name
        return f"iha.Context({state!r}, host_pointers={self.host_pointers})"


_default = None
_default_lock = threading.Lock()


def _close_default():
    """At exit: frees the default context, which writes the programs it built to the disk cache
    (iha_context_free), so the next process loads them instead of compiling."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None


def default_context():
    """The context calls use when given none: created on first use with Context(), freed at
    exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
            atexit.register(_close_default)
        return _default
