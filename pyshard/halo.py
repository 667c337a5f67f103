"""Halo (ghost-cell) exchange on any layout, blocking or overlapped with compute:
:class:`HaloArray`, a shard with ghost layers around it, runs this rank's
:class:`~pyshard.HaloPlan` (:mod:`pyshard.halo_plan`): one message per peer each way, packed
by the core's packers (CPU or CUDA, the same descriptor tables as ``redistribute``), moved
by one of four methods (persistent point-to-point requests by default), split into
``start()`` and ``wait()``. The semantics are :mod:`pyshard.halo_plan`'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional, Tuple

from mpi4py import MPI

from . import _backend as bk
from . import _core, _validate, config
from .halo_plan import HaloPlan, PeriodicArg, WidthArg, halo_plan, halo_spec
from .layout import Layout
from .mesh import Mesh

if TYPE_CHECKING:  # no runtime import: array.py imports this module
    from .array import ShardedArray

__all__ = ["METHODS", "HaloArray"]

log = logging.getLogger("pyshard")

METHODS = ("persistent", "p2p", "datatype", "neighbor")
TUNE_REPS = 5  # updates per method when method="tune"
HALO_TAG = _core.HALO_TAG  # the core's table of MPI tags (cpp/tags.h)


# ----------------------------------------------------------------------------- execution


def _default_method() -> str:
    return config.get("PYSHARD_HALO_METHOD")


def _geometry(p: HaloPlan) -> Any:
    return _core.HaloGeometry(
        p.itemsize,
        list(p.padded_shape),
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.sends],
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.recvs],
        [(list(s), list(t), list(e)) for s, t, e in p.local],
    )


class HaloArray:
    """A sharded array's local block with ghost layers around it (see the module doc).

    ``padded``: the local array with ``width`` ghost cells on each side of each dim;
    ``interior``: the view of ``padded`` that is this rank's owned box; ``array``: a
    :class:`~pyshard.ShardedArray` whose local array is ``interior`` (``redistribute`` and
    ``save`` work on it). :meth:`update` fills the ghost cells from the owners' current
    interiors; :meth:`start` / :meth:`wait` do the same in two halves so that the caller
    computes in between. Every rank of the mesh must call them, in the same order for all
    the halo arrays of a mesh. While an exchange is in flight (after :meth:`start`, before
    :meth:`wait`) the interior may be read and written (the sends were packed when
    :meth:`start` returned), the ghost cells may not be touched (they are written by
    :meth:`wait`, or land by MPI at any time).
    """

    __slots__ = (
        "padded", "interior", "width", "periodic", "corners", "layout", "mesh", "method",
        "chosen",
        "_spec", "_cls", "_step", "_dev", "_active", "_array",
    )

    def __init__(self, x: ShardedArray, width: WidthArg, periodic: PeriodicArg = False,
                 corners: bool = True, method: Optional[str] = None) -> None:
        spec = halo_spec(x.layout, width, periodic, corners)
        method = _default_method() if method is None else method
        if method not in METHODS + ("tune",):
            raise ValueError(
                f"with_halo: method must be one of {METHODS + ('tune',)}, got {method!r}"
            )
        if method == "datatype" and bk.is_device(x.local):
            raise ValueError(
                "with_halo: method='datatype' takes host arrays (MPI datatypes on device "
                "memory need a CUDA-aware MPI's datatype engine); use 'persistent'"
            )
        self._spec = spec
        self.width: Tuple[int, ...] = spec.width
        self.periodic: Tuple[bool, ...] = spec.periodic
        self.corners: bool = spec.corners
        self.method = method
        self.chosen: Optional[str] = None  # the method in use, once built ("tune": measured)
        self.layout: Layout = x.layout
        self.mesh: Mesh = x.mesh
        self._cls = type(x)
        local = x.local
        xp = bk.xp_of(local)
        shape = tuple(s + 2 * w for s, w in zip(local.shape, spec.width))
        self.padded = xp.zeros(shape, dtype=local.dtype)
        # (a 0-d array's interior is the whole 0-d array: index it with `...`, not `()`)
        self.interior = self.padded[
            tuple(slice(w, w + s) for w, s in zip(spec.width, local.shape)) or ...
        ]
        self.interior[...] = local
        self._dev = bk.is_device(local)
        self._step: Any = None
        self._active = False
        self._array: Optional[ShardedArray] = None

    @property
    def array(self) -> ShardedArray:
        """The owned values as a :class:`~pyshard.ShardedArray` (its local array is
        ``interior``, a view: no copy)."""
        if self._array is None:
            self._array = self._cls.wrap(self.interior, self.layout, self.mesh)
        return self._array

    @property
    def plan(self) -> HaloPlan:
        """This rank's :class:`HaloPlan` (cached; no communication)."""
        return halo_plan(self.layout, self._spec, self.mesh.coords)

    def _core_step(self) -> Any:
        if self._step is None:
            if _validate.enabled:
                _validate.agree(self.mesh.comm, "halo update", {
                    "layout": repr(self.layout), "halo": repr(self._spec),
                    "method": self.method,
                })
            p = self.plan
            comm = self.mesh.core_comm(tuple(range(self.mesh.ndim)))
            geom = _geometry(p)
            if self.method == "tune":
                self.chosen, self._step = self._tune(comm, geom)
            else:
                self.chosen = self.method
                self._step = _core.HaloStep(
                    comm, geom, getattr(_core.HaloMethod, self.method), HALO_TAG
                )
            if self._dev:
                bk.announce()
            log.debug("pyshard: halo exchange built for rank %d: %r (%s)", self.mesh.rank, p,
                      self.chosen)
        return self._step

    def _tune(self, comm: Any, geom: Any) -> Tuple[str, Any]:
        """Time every method on this array (a few full updates each, the slowest rank's
        median) and keep the fastest: the same choice on every rank (one allreduce)."""
        staged = _core.transport(_core.Mem.host).name == "staged"
        candidates = [m for m in METHODS if not ((self._dev or staged) and m == "datatype")]
        best: Tuple[float, str, Any] = (float("inf"), "", None)
        for m in candidates:
            step = _core.HaloStep(comm, geom, getattr(_core.HaloMethod, m), HALO_TAG)
            times = []
            for _ in range(TUNE_REPS):
                t0 = time.perf_counter()
                self._run(step)
                times.append(time.perf_counter() - t0)
            t = self.mesh.comm.allreduce(sorted(times)[len(times) // 2], op=MPI.MAX)
            if t < best[0]:
                best = (t, m, step)
        log.info("pyshard: halo method tuned for %r: %s (%.1f us)", self._spec, best[1],
                 best[0] * 1e6)
        return best[1], best[2]

    def _run(self, step: Any) -> None:
        if self._dev:
            ptr, stream = self.padded.data.ptr, bk.stream_ptr()
            step.start_device(ptr, stream)
            step.wait_device(ptr, stream)
            bk.xp_of(self.padded).cuda.get_current_stream().synchronize()
        else:
            step.update(self.padded)

    def update(self) -> None:
        """Fill the ghost cells from the owners' current interiors; collective (blocking)."""
        if self._active:
            raise RuntimeError("HaloArray.update(): an exchange is in flight; call wait() first")
        step = self._core_step()
        if self._dev:
            ptr, stream = self.padded.data.ptr, bk.stream_ptr()
            step.start_device(ptr, stream)
            step.wait_device(ptr, stream)
        else:
            step.update(self.padded)

    def start(self) -> None:
        """Start filling the ghost cells and return at once; :meth:`wait` completes it."""
        if self._active:
            raise RuntimeError("HaloArray.start(): already started; call wait() first")
        step = self._core_step()
        if self._dev:
            step.start_device(self.padded.data.ptr, bk.stream_ptr())
        else:
            step.start(self.padded)
        self._active = True

    def wait(self) -> None:
        """Complete the exchange :meth:`start` began: the ghost cells are filled (on a GPU:
        ready on cupy's current stream)."""
        if not self._active:
            raise RuntimeError("HaloArray.wait(): no exchange in flight; call start() first")
        self._active = False
        if self._dev:
            self._step.wait_device(self.padded.data.ptr, bk.stream_ptr())
        else:
            self._step.wait(self.padded)

    def explain(self) -> str:
        """Peers, messages and bytes of this rank's exchange, and how it runs."""
        how = {
            "persistent": "persistent point-to-point requests (MPI_Send_init/MPI_Recv_init, "
            "MPI_Startall) on packed buffers",
            "p2p": "point-to-point messages (MPI_Isend/MPI_Irecv) per update on packed buffers",
            "datatype": "persistent point-to-point requests on the padded array with one MPI "
            "datatype (subarrays) per message: the MPI library packs and unpacks",
            "neighbor": "one neighbourhood all-to-all on a distributed-graph communicator of "
            "the peers (MPI_Neighbor_alltoallv_init where MPI-4, else MPI_Ineighbor_alltoallw) "
            "on packed buffers",
        }
        m = self.chosen or self.method
        if m == "tune":
            text = self.plan.explain() + "\n  method: tune (measured at the first update)"
        else:
            tuned = " (chosen by measurement)" if self.method == "tune" else ""
            text = self.plan.explain() + f"\n  runs as {how[m]}{tuned}"
        if self._dev:
            text += "\n  GPU arrays: " + (
                "pack kernel, MPI on device memory"
                if bk.transports()["cuda"] == "direct"
                else "pack kernel, staged through pinned host buffers"
            )
        return text

    def __repr__(self) -> str:
        return (
            f"HaloArray({self.layout!r}, width {self.width}, periodic {self.periodic}, "
            f"{'box' if self.corners else 'star'} stencil, padded {tuple(self.padded.shape)})"
        )
