"""``checkpoint_info``: what a checkpoint of any format holds, from its metadata alone (no
MPI)."""

from __future__ import annotations

from typing import Any, Dict

from .errors import PathArg, norm_path
from .formats import open_arrays

__all__ = ["checkpoint_info"]


def checkpoint_info(path: PathArg) -> Dict[str, Any]:
    """Describe a checkpoint from its metadata alone: no MPI communication, no data read.

    path: a pyshard checkpoint directory, an HDF5 or safetensors file, or a Zarr v3 group or
    array directory (from pyshard or from another tool: the format is detected).

    Returns ``{"path", "format", "version", "ranks", "created", "metadata", "arrays",
    "unsupported"}``
    where ``format`` is ``"npy"``, ``"hdf5"``, ``"safetensors"`` or ``"zarr"`` and
    ``arrays[name]`` has ``shape`` (tuple), ``dtype`` (numpy dtype; ``str()`` of it is the
    name, e.g. ``"float32"``, ``"bfloat16"``), ``file``, ``nbytes``
    and the layout it was saved from: ``mesh_shape`` (tuple), ``placements`` (strings such
    as ``"S(0)"``, ``"R"``, ``"P(sum)"``) and ``sizes`` (``{array_dim: extents}``); files
    from other tools have no layout (``()``, ``[]``, ``{}``) and ``version``, ``ranks`` and
    ``created`` None. ``unsupported`` maps the name of each entry pyshard cannot hold (a
    string dataset, an unknown codec or dtype) to the reason, a str: those are not in
    ``arrays``, and only a load that names one fails. Raises FileNotFoundError or
    ValueError naming the path when it is not a checkpoint, ImportError naming the extra
    when the format's package is missing.
    """
    path = norm_path(path, "checkpoint_info")
    fmt, table, facts = open_arrays(path, "checkpoint_info")
    arrays = {}
    bad = {}
    for name, e in table.items():
        if e["kind"] == "unsupported":
            bad[name] = e["reason"]
            continue
        arrays[name] = {
            "shape": e["shape"],
            "dtype": e["dtype"],
            "file": e.get("info_file", e["file"]),
            "nbytes": e["nbytes"],
            "mesh_shape": e["mesh_shape"],
            "placements": e["placements"],
            "sizes": e["sizes"],
        }
    return {"path": path, "format": fmt.name, **facts, "arrays": arrays, "unsupported": bad}
