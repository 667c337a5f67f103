"""A plan explained on the execution side: :meth:`pyshard.Plan.explain` (what the plan says,
pure) with the lines that depend on the settings and the core: where each step goes for host
arrays called with an algorithm (``PYSHARD_ALGORITHM`` unless named; the rule in words, or, on
a given mesh, the path
:func:`pyshard.route.route` takes there) and how GPU arrays reach MPI.

>>> from pyshard.explain import explain
>>> print(explain(x.plan_to([Shard(1)]), mesh=x.mesh))  # doctest: +SKIP
"""

from __future__ import annotations

from math import prod
from typing import Any, Optional, Sequence

from . import _backend, config
from .planner import Plan, Step
from .route import describe, route

__all__ = ["device_note", "explain", "route_note"]


def route_note(s: Step, mesh: Any = None, algorithm: str = "auto") -> Optional[str]:
    """The line on where step ``s`` goes for host arrays called with ``algorithm``: the path
    :func:`pyshard.route.route` takes on ``mesh``, or without one the rule in words
    (:func:`pyshard.route.describe`). A step that communicates nothing: on a mesh, the line
    says ``local`` (every step of the plan gets one, so the lines follow the steps); without
    one, None."""
    if mesh is not None:
        r = route(s, mesh, algorithm)
        how = r.path + (f" ({r.algorithm})" if r.algorithm not in ("", r.path) else "")
        if r.path == "shm" and r.node is not None and r.node.nodes > 1:  # the mixed path
            n, k = prod(s.group_shape), r.node.node_size
            how += (
                f"; node-shared memory among the {k} ranks of this rank's node, MPI to the "
                f"other {n - k} on {r.node.nodes - 1} other node(s)"
            )
        if r.why:
            how += f"; {r.why}"
        return f"host arrays, algorithm {algorithm}, on this mesh: {how}"
    how = describe(s, algorithm)
    return None if how is None else f"host arrays, algorithm {algorithm}: {how}"


def device_note() -> str:
    """The line on how GPU arrays reach MPI (from the settings and the MPI library)."""
    t = _backend.transports()["cuda"]
    aware = {True: "CUDA-aware", False: "not CUDA-aware", None: "CUDA-awareness unknown"}[
        _backend.cuda_aware()
    ]
    if t == "direct":
        return f"GPU arrays: pack kernel, then MPI on device memory (MPI {aware})"
    return (
        f"GPU arrays: pack kernel, copy to pinned host buffers, MPI on host memory, copy back, "
        f"unpack kernel (staged; MPI {aware})"
    )


def explain(
    plan: Plan, coords: Optional[Sequence[int]] = None, device: str = "cpu", mesh: Any = None,
    algorithm: Optional[str] = None,
) -> str:
    """Readable text of ``plan``: :meth:`~pyshard.Plan.explain` at ``coords`` (default: the
    mesh's own coords when ``mesh`` is given, else mesh coords 0), with, under each
    collective step, where it goes for host arrays called with ``algorithm`` (default: what
    a call that names none takes, ``PYSHARD_ALGORITHM``; the rule in words, or, given the
    :class:`~pyshard.Mesh` it runs on, the path :func:`pyshard.route.route` takes for it
    there), and with ``device="cuda"`` how GPU arrays reach MPI (on device memory with a
    CUDA-aware MPI, else staged through pinned host buffers)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"explain(device): expected 'cpu' or 'cuda', got {device!r}")
    if algorithm is None:  # (what exchange.default_algorithm gives a call naming none)
        algorithm = config.get("PYSHARD_ALGORITHM")
    if coords is None and mesh is not None:
        coords = mesh.coords
    notes = [route_note(s, mesh, algorithm) for s in plan.steps]
    tail = [device_note()] if device == "cuda" and plan.collectives else []
    return plan.explain(coords, notes, tail)
