"""The ctypes declarations (iha/_lib.py) against include/iha*.h: ctypes cannot see the header,
so a field added, moved or retyped there, or a call's argument list changed, would go
unnoticed until memory is corrupted. This reads the header of the repository the tests run
from and compares the structures and calls the package declares."""

import ctypes
import re
from pathlib import Path

import pytest

from iha import _lib

INCLUDE = Path(__file__).resolve().parents[2] / "include"
pytestmark = pytest.mark.skipif(not (INCLUDE / "iha.h").exists(), reason="needs the repository's include/iha.h")

# C declarations as the header spells them, and the ctypes type each must be.
C_TYPES = {
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "float": ctypes.c_float, "double": ctypes.c_double,
    "size_t": ctypes.c_size_t, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "const char *": ctypes.c_char_p, "cl_context": ctypes.c_void_p, "cl_command_queue": ctypes.c_void_p,
    "cl_mem": ctypes.c_void_p, "iha_buffer": _lib.Buffer, "char": ctypes.c_char,
    "const size_t *": ctypes.POINTER(ctypes.c_size_t),
}
STRUCTS = {
    "iha_device_info": _lib.DeviceInfo,
    "iha_context_options": _lib.ContextOptions,
    "iha_attention_options": _lib.AttentionOptions,
    "iha_shape": _lib.Shape,
    "iha_buffer": _lib.Buffer,
    "iha_layer_weights": _lib.LayerWeights,
    "iha_layer_grads": _lib.LayerGrads,
    "iha_kv_cache_options": _lib.KVCacheOptions,
    "iha_partial_block": _lib.PartialBlock,
}


def header_text():
    """Every public header, without comments (a call may live in iha.h or a header it includes)."""
    text = "\n".join(path.read_text() for path in sorted(INCLUDE.glob("iha*.h")))
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def struct_fields(text, name):
    """[(field, C type, array length or None)] of `typedef struct name { ... } name;`."""
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, flags=re.S)
    assert body, name
    fields = []
    for declaration in body.group(1).split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        match = re.match(r"((?:const )?[a-z_0-9]+(?: \*)?) ?(.*)$", declaration.replace(" *", " * ").replace("  ", " "))
        ctype, names = match.group(1).strip(), match.group(2)
        for item in names.split(","):
            item = item.strip()
            pointer = item.startswith("*")
            item = item.lstrip("* ")
            array = re.match(r"(\w+)\[(\d+)\]$", item)
            full_type = ctype + (" *" if pointer else "")
            if array:
                fields.append((array.group(1), full_type, int(array.group(2))))
            else:
                fields.append((item, full_type, None))
    return fields


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_structures_match_the_header(name):
    declared = STRUCTS[name]._fields_
    fields = struct_fields(header_text(), name)
    assert [f[0] for f in fields] == [f[0] for f in declared], name
    for (field, ctype, length), (_, pytype) in zip(fields, declared):
        expected = C_TYPES[ctype]
        if length is not None:
            expected = expected * length
        assert ctypes.sizeof(pytype) == ctypes.sizeof(expected), (name, field)
        assert pytype is expected or getattr(pytype, "_type_", None) == getattr(expected, "_type_", None), \
            (name, field, ctype)


def test_calls_take_the_header_arguments():
    text = header_text()
    for name, function in vars(_lib.lib).items():
        if not name.startswith("iha_") or not hasattr(function, "argtypes"):
            continue
        declaration = re.search(r"IHA_API [^;(]*\b%s\(([^)]*)\);" % name, text, flags=re.S)
        assert declaration, name
        arguments = declaration.group(1).strip()
        count = 0 if arguments in ("", "void") else arguments.count(",") + 1
        assert count == len(function.argtypes), name
