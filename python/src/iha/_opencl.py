"""The few OpenCL 1.2 calls the package makes itself: buffers for the library's device tensors,
through the ICD loader (libOpenCL.so.1) that libiha.so links.

Two ways to give the device a host array (Context.host_pointers chooses):
- host pointers: the buffer is made on the array's own memory (CL_MEM_USE_HOST_PTR), so a
  device that shares host memory (a CPU driver such as PoCL) reads and writes the array in
  place; an output is mapped and unmapped after the work, which is what makes the host's view
  current on any device;
- copies: a device buffer filled from the array when it is made (CL_MEM_COPY_HOST_PTR), and
  outputs read back into their arrays (clEnqueueReadBuffer), the usual path to a discrete GPU.
"""

import ctypes

from . import _lib

CL_MEM_READ_WRITE = 1 << 0
CL_MEM_READ_ONLY = 1 << 2
CL_MEM_USE_HOST_PTR = 1 << 3
CL_MEM_COPY_HOST_PTR = 1 << 5
CL_MAP_READ = 1 << 0
CL_DEVICE_HOST_UNIFIED_MEMORY = 0x1035

_cl = ctypes.CDLL("libOpenCL.so.1")
_P = ctypes.c_void_p
_sz = ctypes.c_size_t
_i = ctypes.c_int32
_u = ctypes.c_uint32
_u64 = ctypes.c_uint64
for _name, _res, _args in (
    ("clCreateBuffer", _P, [_P, _u64, _sz, _P, ctypes.POINTER(_i)]),
    ("clReleaseMemObject", _i, [_P]),
    ("clEnqueueReadBuffer", _i, [_P, _P, _u, _sz, _sz, _P, _u, _P, _P]),
    ("clEnqueueMapBuffer", _P, [_P, _P, _u, _u64, _sz, _sz, _u, _P, _P, ctypes.POINTER(_i)]),
    ("clEnqueueUnmapMemObject", _i, [_P, _P, _P, _u, _P, _P]),
    ("clFinish", _i, [_P]),
    ("clGetDeviceInfo", _i, [_P, _u, _sz, _P, ctypes.POINTER(_sz)]),
):
    _function = getattr(_cl, _name)
    _function.restype = _res
    _function.argtypes = _args

# OpenCL's codes for memory exhaustion (allocation failure, out of resources, out of host
# memory) and for a size beyond the device's largest allocation.
_MEMORY_CODES = {-4, -5, -6, -61}


def _check(code, what):
    if code == 0:
        return
    status = -6 if code in _MEMORY_CODES else -9
    raise _lib.error(status, f"{what} failed with OpenCL error {code}")


def host_unified_memory(device):
    """Whether the device shares the host's memory (CL_DEVICE_HOST_UNIFIED_MEMORY)."""
    value = _u(0)
    code = _cl.clGetDeviceInfo(device, CL_DEVICE_HOST_UNIFIED_MEMORY, ctypes.sizeof(value), ctypes.byref(value), None)
    return code == 0 and value.value != 0


class DeviceBuffer:
    """One cl_mem, released when the object goes. `array` is the host array it was made on or
    from (kept alive while the buffer lives, since a host-pointer buffer is that memory)."""

    def __init__(self, context, nbytes, flags, host=None):
        self.mem = None
        self.context = context
        self.array = host
        self.nbytes = nbytes
        pointer = host.ctypes.data if host is not None else None
        code = _i(0)
        self.mem = _cl.clCreateBuffer(context.cl_context, flags, nbytes, pointer, ctypes.byref(code))
        if not self.mem:
            _check(code.value or -9999, f"clCreateBuffer of {nbytes} bytes")

    def buffer(self):
        return _lib.Buffer(self.mem, 0)

    def release(self):
        if self.mem:
            _cl.clReleaseMemObject(self.mem)
            self.mem = None
        self.array = None

    def __del__(self):
        self.release()


def input_buffer(context, array):
    """A read-only device tensor holding a C-contiguous array's values."""
    mode = CL_MEM_USE_HOST_PTR if context.host_pointers else CL_MEM_COPY_HOST_PTR
    return DeviceBuffer(context, array.nbytes, CL_MEM_READ_ONLY | mode, array)


def output_buffer(context, array):
    """A device tensor whose values end up in the C-contiguous `array` after finish_output."""
    if context.host_pointers:
        return DeviceBuffer(context, array.nbytes, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, array)
    buffer = DeviceBuffer(context, array.nbytes, CL_MEM_READ_WRITE)
    buffer.array = array
    return buffer


def inout_buffer(context, array):
    """A device tensor that starts with a C-contiguous array's values and whose values end up
    back in it after finish_output (a running state, or a gradient added into)."""
    mode = CL_MEM_USE_HOST_PTR if context.host_pointers else CL_MEM_COPY_HOST_PTR
    return DeviceBuffer(context, array.nbytes, CL_MEM_READ_WRITE | mode, array)


def scratch_buffer(context, nbytes):
    """A device-only tensor (the state a forward keeps for its backward)."""
    return DeviceBuffer(context, nbytes, CL_MEM_READ_WRITE)


def finish_output(context, buffer):
    """Brings an output's values into its host array, after the work that wrote it."""
    queue = context.cl_queue
    if context.host_pointers:
        code = _i(0)
        mapped = _cl.clEnqueueMapBuffer(queue, buffer.mem, 1, CL_MAP_READ, 0, buffer.nbytes, 0, None, None,
                                        ctypes.byref(code))
        _check(code.value, "clEnqueueMapBuffer")
        _check(_cl.clEnqueueUnmapMemObject(queue, buffer.mem, mapped, 0, None, None), "clEnqueueUnmapMemObject")
        _check(_cl.clFinish(queue), "clFinish")
    else:
        _check(_cl.clEnqueueReadBuffer(queue, buffer.mem, 1, 0, buffer.nbytes, buffer.array.ctypes.data, 0, None,
                                       None), "clEnqueueReadBuffer")
