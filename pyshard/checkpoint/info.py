"""``checkpoint_info``: what a checkpoint holds, from its manifest alone (no MPI)."""

from __future__ import annotations

from typing import Any, Dict

from .errors import PathArg, norm_path
from .manifest import dtype_of, read_manifest

__all__ = ["checkpoint_info"]


def checkpoint_info(path: PathArg) -> Dict[str, Any]:
    """Describe a checkpoint from its manifest alone: no MPI communication, no data read.

    path: the checkpoint directory.

    Returns ``{"path", "version", "ranks", "created", "metadata", "arrays"}`` where
    ``arrays[name]`` has ``shape`` (tuple), ``dtype`` (numpy dtype; ``str()`` of it is the
    name, e.g. ``"float32"``, ``"bfloat16"``), ``file``, ``nbytes``
    and the layout it was saved from: ``mesh_shape`` (tuple), ``placements`` (strings such
    as ``"S(0)"``, ``"R"``, ``"P(sum)"``) and ``sizes`` (``{array_dim: extents}``).
    Raises FileNotFoundError or ValueError naming the path when it is not a checkpoint.
    """
    path = norm_path(path, "checkpoint_info")
    m = read_manifest(path, "checkpoint_info")
    arrays = {}
    for name, e in m["arrays"].items():
        arrays[name] = {
            "shape": tuple(int(s) for s in e["shape"]),
            "dtype": dtype_of(e, "checkpoint_info"),
            "file": e["file"],
            "nbytes": int(e["nbytes"]),
            "mesh_shape": tuple(int(s) for s in e.get("mesh_shape", ())),
            "placements": list(e.get("placements", [])),
            "sizes": {int(d): tuple(int(v) for v in x) for d, x in e.get("sizes", {}).items()},
        }
    return {
        "path": path,
        "version": m["version"],
        "ranks": m.get("ranks"),
        "created": m.get("created"),
        "metadata": m.get("metadata", {}),
        "arrays": arrays,
    }
