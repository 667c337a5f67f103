"""The safetensors format (:class:`SafetensorsFormat`): the header a save writes, and the
checks a load makes before it trusts a file (ours or another tool's).

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the data:
``{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` with the offsets relative to the data start, each tensor C-order little-endian
bytes. pyshard writes the header itself (rank 0) and every rank writes its runs of each tensor
at its offset (the one-file save of :mod:`~pyshard.checkpoint.onefile`), so neither a save
nor a load needs the safetensors package.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .driver import Arrays, Facts, Items, unsupported
from .onefile import OneFile
from .record import facts, layout_of, parse_record

__all__ = ["SafetensorsFormat"]

log = logging.getLogger("pyshard")

MAX_HEADER = 100_000_000
"""The largest header accepted (bytes): the limit the safetensors library itself enforces."""

ALIGN = 8
"""The header is padded with spaces so the data starts 8-byte aligned (as safetensors does)."""

# safetensors' dtype names -> numpy / ml_dtypes names (whole bytes per element only)
NAMES: Dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}
CODES: Dict[str, str] = {v: k for k, v in NAMES.items()}


def code_of(dtype: np.dtype, what: str = "save") -> str:
    """safetensors' name of ``dtype``; TypeError for a dtype the format cannot hold."""
    name = _dtypes.name(dtype) if _dtypes.is_ml(dtype) else np.dtype(dtype).name
    if name not in CODES or (not _dtypes.is_ml(dtype) and np.dtype(dtype).byteorder == ">"):
        raise TypeError(
            f"{what}: safetensors cannot hold dtype {dtype} (it holds "
            f"{', '.join(sorted(CODES))}, little-endian)"
        )
    return CODES[name]


def dtype_of_code(code: object, what: str) -> np.dtype:
    """The numpy dtype of safetensors' name ``code``; ValueError for an unknown one."""
    if not isinstance(code, str) or code not in NAMES:
        raise ValueError(
            f"{what}: dtype {code!r} is not one pyshard can hold (it reads "
            f"{', '.join(sorted(NAMES))})"
        )
    return _dtypes.resolve(NAMES[code], what)


def build_header(
    tensors: List[Tuple[str, Tuple[int, ...], np.dtype]], meta: Dict[str, str]
) -> Tuple[bytes, Dict[str, int]]:
    """(the header bytes, length prefix and padding included; each tensor's offset in the
    file) for ``tensors`` (name, shape, dtype) stored in that order, back to back."""
    table: Dict[str, Any] = {"__metadata__": meta} if meta else {}
    pos = 0
    rel = {}
    for name, shape, dtype in tensors:
        n = prod(shape) * dtype.itemsize
        table[name] = {
            "dtype": code_of(dtype),
            "shape": list(shape),
            "data_offsets": [pos, pos + n],
        }
        rel[name] = pos
        pos += n
    body = json.dumps(table, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % ALIGN)
    start = 8 + len(body)
    return struct.pack("<Q", len(body)) + body, {n: start + r for n, r in rel.items()}


def parse(fname: str, what: str = "load") -> Tuple[Dict[str, Dict[str, Any]], Dict[str, str], int]:
    """Check a safetensors file and read its table: ({name: {"shape", "dtype", "offset",
    "nbytes"}, or {"reason"} for a tensor of a dtype pyshard cannot hold}, the
    ``__metadata__`` dict, the data size). ValueError naming the file for anything
    untrustworthy, before any allocation the header does not bound: a header over
    :data:`MAX_HEADER` or past the file, bad JSON, a shape whose bytes do not match its
    offsets, an offset or length outside the file, overlapping tensors (the offsets of a
    tensor of an unknown dtype are checked too)."""
    size = os.path.getsize(fname)
    with open(fname, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{what}: {fname!r} is not a safetensors file (under 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise ValueError(
                f"{what}: {fname!r}: the safetensors header claims {n} bytes, over the "
                f"{MAX_HEADER}-byte limit"
            )
        if 8 + n > size:
            raise ValueError(
                f"{what}: {fname!r}: the safetensors header claims {n} bytes but only "
                f"{size - 8} follow its 8-byte length (truncated, or not a safetensors file)"
            )
        raw = f.read(n)
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{what}: {fname!r}: the safetensors header is not JSON ({e})") from e
    if not isinstance(table, dict):
        raise ValueError(f"{what}: {fname!r}: the safetensors header is not a JSON object")
    meta = table.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise ValueError(f"{what}: {fname!r}: __metadata__ must map strings to strings")
    data = size - 8 - n
    out: Dict[str, Dict[str, Any]] = {}
    spans = []
    for name, e in table.items():
        where = f"{what}: {fname!r}: tensor {name!r}"
        try:
            shape = tuple(e["shape"])
            begin, end = e["data_offsets"]
            code = e["dtype"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: malformed entry ({err!r})") from err
        if not all(type(s) is int and s >= 0 for s in shape) or not all(
            type(o) is int and o >= 0 for o in (begin, end)
        ):
            raise ValueError(f"{where}: shape and offsets must be non-negative ints")
        if end < begin or end > data:
            raise ValueError(
                f"{where}: data_offsets [{begin}, {end}] lie outside the {data} data bytes of "
                f"the file (truncated or corrupt)"
            )
        spans.append((begin, end, name))
        try:
            dtype = dtype_of_code(code, where)
        except ValueError:  # its bytes are bounded and checked above: the others load
            out[name] = {"reason": f"dtype {code!r} is not one pyshard can hold (it reads "
                                   f"{', '.join(sorted(NAMES))})"}  # fmt: skip
            continue
        nbytes = prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise ValueError(
                f"{where}: shape {list(shape)} of {code} needs {nbytes} bytes but its "
                f"data_offsets span {end - begin}"
            )
        out[name] = {"shape": shape, "dtype": dtype, "offset": 8 + n + begin, "nbytes": nbytes}
    spans.sort()
    for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(
                f"{what}: {fname!r}: tensors {n0!r} and {n1!r} overlap (bytes {b1}..{e0})"
            )
    return out, meta, data


def is_safetensors(fname: str) -> bool:
    """Does ``fname`` start with a safetensors header: an 8-byte little-endian length N (at
    most :data:`MAX_HEADER`, within the file), then N bytes of JSON, an object (its ``{`` at
    byte 8)? The whole header is checked, so that data inside a safetensors file (an HDF5
    signature at byte 512, 1024, ... where HDF5 allows a user block) cannot make it look
    like another format's file."""
    try:
        size = os.path.getsize(fname)
        with open(fname, "rb") as f:
            head = f.read(9)
            if len(head) < 9 or head[8:9] != b"{":
                return False
            (n,) = struct.unpack("<Q", head[:8])
            if n > MAX_HEADER or 8 + n > size:
                return False
            f.seek(8)
            raw = f.read(n)
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except (OSError, UnicodeDecodeError, ValueError):
        return False


def starts_like_safetensors(fname: str) -> bool:
    """Does ``fname`` start like a safetensors file (9 bytes or more, ``{`` at byte 8)?
    A file no format claims that does is described as a damaged safetensors file."""
    try:
        with open(fname, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{"


def pyshard_meta(meta: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """The pyshard record a save kept in ``__metadata__["pyshard"]``, or None."""
    return parse_record(meta.get("pyshard"))


class SafetensorsFormat(OneFile):
    """One safetensors file: a JSON header, then every tensor's bytes back to back."""

    name = "safetensors"
    label = "safetensors"
    target = "a safetensors file"

    def probe(self, path: str) -> bool:
        return os.path.isfile(path) and is_safetensors(path)

    def resembles(self, path: str) -> bool:
        return starts_like_safetensors(path)

    def replaceable(self, path: str) -> bool:
        return self.probe(path)

    def describe(self, path: str, what: str) -> Tuple[Arrays, Facts]:
        table, meta, _ = parse(path, what)
        rec = pyshard_meta(meta)
        arrays = {}
        for name, e in table.items():
            if "reason" in e:
                arrays[name] = unsupported(e["reason"], path)
                continue
            dtype = e["dtype"]
            layout = layout_of(rec, name, e["shape"], f"{what}: {path!r}", dtype)
            arrays[name] = {
                "shape": e["shape"],
                "dtype": dtype,
                "nbytes": e["nbytes"],
                "file": path,
                "kind": "raw",
                "offset": e["offset"],
                **layout,
            }
        return arrays, facts(rec, meta)

    def check_save(self, items: Items) -> None:
        for name, x in items:
            if name == "__metadata__":
                raise ValueError(
                    "save(arrays['__metadata__']): safetensors keeps its metadata under that "
                    "name: no tensor may be called '__metadata__'"
                )
            code_of(x.dtype, f"save(arrays[{name!r}])")

    def lay_out(self, tmp: str, items: Items, rec: str) -> Dict[str, Optional[int]]:
        meta = {"pyshard": rec}
        user = json.loads(rec)["metadata"]
        meta.update({k: v for k, v in user.items() if isinstance(v, str) and k != "pyshard"})
        hdr, offs = build_header([(n, tuple(x.global_shape), x.dtype) for n, x in items], meta)
        with open(tmp, "wb") as f:
            f.write(hdr)
        return dict(offs)
