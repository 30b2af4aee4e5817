"""The ctypes declarations of include/iha.h that the package uses, and its status codes as
Python exceptions.

The structures mirror the header field for field; ctypes lays them out by the platform's C
rules, as the C compiler does. The library is the package's own libiha.so.0 (installed beside
this file under its SONAME, which no module finder takes for a Python extension, as it would
libiha.so); IHA_LIBRARY names another one, for running against a development build.
"""

import ctypes
import os

c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_int = ctypes.c_int
c_uint = ctypes.c_uint
c_float = ctypes.c_float
c_double = ctypes.c_double
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_uint16 = ctypes.c_uint16
c_uint32 = ctypes.c_uint32

MASKS = {"causal": 0, "token_causal": 1, "none": 2}
STORAGES = {"float32": 0, "float16": 1, "bfloat16": 2}


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("platform_index", c_uint),
        ("device_index", c_uint),
        ("platform_name", ctypes.c_char * 128),
        ("platform_version", ctypes.c_char * 128),
        ("device_name", ctypes.c_char * 128),
        ("device_vendor", ctypes.c_char * 128),
        ("driver_version", ctypes.c_char * 128),
        ("device_version", ctypes.c_char * 128),
        ("is_gpu", c_int),
        ("is_cpu", c_int),
        ("has_fp16", c_int),
        ("compute_units", c_uint),
        ("global_mem_bytes", c_uint64),
        ("max_alloc_bytes", c_uint64),
        ("local_mem_bytes", c_uint64),
        ("local_mem_is_global", c_int),
        ("max_work_group_size", c_size_t),
    ]


class ContextOptions(ctypes.Structure):
    _fields_ = [
        ("device", c_char_p),
        ("cache_dir", c_char_p),
        ("kernel_dir", c_char_p),
        ("opencl_context", c_void_p),
        ("opencl_queue", c_void_p),
        ("time_stages", c_int),
        ("profile", c_char_p),
        ("tune_on_first_use", c_int),
        ("tune_budget_s", c_double),
    ]


class AttentionOptions(ctypes.Structure):
    _fields_ = [
        ("mask", c_int),
        ("window", c_int64),
        ("scale", c_float),
        ("rope", c_int),
        ("rope_base", c_float),
        ("storage", c_int),
        ("weight_storage", c_int),
        ("seq_lens", ctypes.POINTER(c_size_t)),
        ("seq_count", c_size_t),
        ("accumulate", c_int),
    ]


class Shape(ctypes.Structure):
    _fields_ = [(name, c_size_t) for name in ("batch", "tokens", "model_dim", "heads", "head_dim", "pseudo")]


class KVCacheOptions(ctypes.Structure):
    _fields_ = [("storage", c_int), ("window", c_int64), ("cache_tokens", c_size_t), ("compact", c_int)]


class Buffer(ctypes.Structure):
    _fields_ = [("mem", c_void_p), ("offset", c_size_t)]


_WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "alpha_q", "alpha_k", "alpha_v", "r")


class LayerWeights(ctypes.Structure):
    """iha_layer_weights; iha_layer_grads has the same layout."""

    _fields_ = [(name, Buffer) for name in _WEIGHT_NAMES]


LayerGrads = LayerWeights


class PartialBlock(ctypes.Structure):
    _fields_ = [("q_offset", c_size_t), ("k_offset", c_size_t), ("k_tokens", c_size_t), ("first", c_int)]


class Error(Exception):
    """A failed library call: `status` is its iha_status, `name` the status's name, and the
    message is the library's explanation (iha_context_message)."""

    def __init__(self, status, name, message):
        super().__init__(message)
        self.status = status
        self.name = name


class InvalidArgumentError(Error, ValueError):
    """IHA_ERROR_INVALID_ARGUMENT: an argument is out of range."""


class SizeOverflowError(Error, ValueError):
    """IHA_ERROR_SIZE_OVERFLOW: a size computed from the shape overflows."""


class BufferTooSmallError(Error, ValueError):
    """IHA_ERROR_BUFFER_TOO_SMALL: a tensor is smaller than its shape requires."""


class UnsupportedError(Error, RuntimeError):
    """IHA_ERROR_UNSUPPORTED: a valid request the library or the device does not support."""


class HostMemoryError(Error, MemoryError):
    """IHA_ERROR_HOST_MEMORY."""


class DeviceMemoryError(Error, MemoryError):
    """IHA_ERROR_DEVICE_MEMORY: the device ran out, or a buffer exceeds its largest allocation."""


class NoDeviceError(Error, RuntimeError):
    """IHA_ERROR_NO_DEVICE: no OpenCL device matches the request."""


class BuildError(Error, RuntimeError):
    """IHA_ERROR_BUILD: a kernel failed to build; the message holds the build log."""


class OpenCLError(Error, RuntimeError):
    """IHA_ERROR_OPENCL: an OpenCL call failed."""


class GemmError(Error, RuntimeError):
    """IHA_ERROR_GEMM: CLBlast failed."""


class IOFailure(Error, OSError):
    """IHA_ERROR_IO: a file (program cache, profile) could not be read or written."""


class ProfileError(Error, RuntimeError):
    """IHA_ERROR_PROFILE: the tuning profile was ignored."""


# Every status of iha.h's IHA_STATUS_MAP but IHA_OK (tests/test_errors.py checks the table
# against the library's iha_status_name).
ERRORS = {
    -1: InvalidArgumentError,
    -2: UnsupportedError,
    -3: SizeOverflowError,
    -4: BufferTooSmallError,
    -5: HostMemoryError,
    -6: DeviceMemoryError,
    -7: NoDeviceError,
    -8: BuildError,
    -9: OpenCLError,
    -10: GemmError,
    -11: IOFailure,
    -12: ProfileError,
}


def _declare(lib):
    P = c_void_p
    B = Buffer
    S = ctypes.POINTER(Shape)
    O = ctypes.POINTER(AttentionOptions)
    W = ctypes.POINTER(LayerWeights)
    BL = ctypes.POINTER(PartialBlock)
    signatures = {
        "iha_version_string": (c_char_p, []),
        "iha_status_name": (c_char_p, [c_int]),
        "iha_status_description": (c_char_p, [c_int]),
        "iha_devices_list": (c_int, [ctypes.POINTER(DeviceInfo), c_size_t, ctypes.POINTER(c_size_t)]),
        "iha_context_options_init": (None, [ctypes.POINTER(ContextOptions)]),
        "iha_context_create": (c_int, [ctypes.POINTER(P), ctypes.POINTER(ContextOptions), c_char_p, c_size_t]),
        "iha_context_free": (None, [P]),
        "iha_context_message": (c_char_p, [P]),
        "iha_context_cl_context": (P, [P]),
        "iha_context_cl_queue": (P, [P]),
        "iha_context_cl_device": (P, [P]),
        "iha_context_device_name": (c_char_p, [P]),
        "iha_context_finish": (c_int, [P]),
        "iha_context_trim": (None, [P]),
        "iha_attention_options_init": (None, [O]),
        "iha_forward": (c_int, [P, S, O, W, B, B]),
        "iha_attention_core": (c_int, [P, S, O, W, B, B, B, B]),
        "iha_attention_core_backward": (c_int, [P, S, O, W, B, B, B, B, B, B, B, W]),
        "iha_backward": (c_int, [P, S, O, W, B, B, B, W]),
        "iha_attention_partial": (c_int, [P, S, O, BL, B, B, B, B, B]),
        "iha_attention_partial_backward": (c_int, [P, S, O, BL, B, B, B, B, B, B, B, B, B]),
        "iha_attention": (c_int, [P, S, O, B, B, B, B, B]),
        "iha_attention_backward": (c_int, [P, S, O, B, B, B, B, B, B, B, B, B]),
        "iha_layer_expand": (c_int, [P, S, O, W, c_size_t, B, B, B, B]),
        "iha_layer_collapse": (c_int, [P, S, O, W, B, B]),
        "iha_layer_collapse_backward": (c_int, [P, S, O, W, B, B, B, W]),
        "iha_layer_expand_backward": (c_int, [P, S, O, W, c_size_t, B, B, B, B, B, W]),
        "iha_saved_elements": (c_int, [P, S, ctypes.POINTER(c_size_t)]),
        "iha_forward_save": (c_int, [P, S, O, W, B, B, B]),
        "iha_backward_saved": (c_int, [P, S, O, W, B, B, B, B, W]),
        "iha_kv_cache_create": (c_int, [P, S, c_int, ctypes.POINTER(P)]),
        "iha_kv_cache_options_init": (None, [ctypes.POINTER(KVCacheOptions)]),
        "iha_kv_cache_create_with": (c_int, [P, S, ctypes.POINTER(KVCacheOptions), ctypes.POINTER(P)]),
        "iha_kv_cache_free": (None, [P]),
        "iha_kv_cache_reset": (None, [P]),
        "iha_kv_cache_truncate": (c_int, [P, c_size_t, c_size_t]),
        "iha_kv_cache_length": (c_size_t, [P, c_size_t]),
        "iha_kv_cache_bytes": (c_size_t, [P]),
        "iha_decode_step": (c_int, [P, P, S, O, W, ctypes.POINTER(c_uint32), B, B]),
        "iha_bf16_from_float": (None, [P, P, c_size_t]),
        "iha_bf16_to_float": (None, [P, P, c_size_t]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


# The SONAME of the ABI that the declarations above mirror.
LIBRARY = "libiha.so.0"


def _load():
    path = os.environ.get("IHA_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)
    return _declare(ctypes.CDLL(path))


lib = _load()


def status_name(status):
    return lib.iha_status_name(status).decode()


def error(status, message):
    """The exception for a failed status, with the library's message (or, when it left none,
    the status's generic description)."""
    if not message:
        message = lib.iha_status_description(status).decode()
    cls = ERRORS.get(status, Error)
    return cls(status, status_name(status), message)
