"""The ``fft3d`` bench case: a pencil 3-D FFT with :mod:`pyshard.fft`, timed (the whole
transform and its two transposes alone) next to mpi4py-fft's ``PFFT`` with
``backend="numpy"`` (the same serial FFT) on the same global array, both checked against
``numpy.fft.fftn``.

A *pencil* holds one axis whole on every rank; the two mesh dims of a 2-D mesh split the
other two. ``order`` names the axes in the order they are transformed (x, y, z: axes 0, 1,
2), from its first pencil to its last (:func:`pencils`): ``"xyz"`` goes ``[Shard(1),
Shard(2)] -> [Shard(0), Shard(2)] -> [Shard(0), Shard(1)]``, ``"zxy"`` (the default: one
copy per exchange, docs/performance.md) ``[Shard(0), Shard(1)] -> [Shard(2), Shard(1)] ->
[Shard(2), Shard(0)]``; every ordered pair of sharded axes starts one order
(:func:`order_of`). The transform is ``pyshard.fft.plan(layout, "fftn", placements=<last
pencil>)`` (one transpose per mesh dim of size > 1, each one collective on that mesh dim),
run with ``out=`` one buffer every rep reuses.

:func:`time_fft3d` and :func:`time_pfft` time one side each (``examples/fft3d.py``),
:func:`bench_fft3d` makes the row and :func:`format_fft3d` prints it; :func:`sample_array`
builds any rank's box of the test array (the ``fft`` case's too). mpi4py-fft is optional
(``pip install .[bench-fft]``, which needs FFTW: ``apt-get install libfftw3-dev``).
"""

from __future__ import annotations

from itertools import permutations
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives
from .. import fft as pf
from ..array import ShardedArray
from ..fft.planner import Move
from ..layout import Layout, Shard
from ..mesh import Mesh
from .timing import timed

__all__ = [
    "DEFAULT_ORDER",
    "ORDERS",
    "bench_fft3d",
    "format_fft3d",
    "order_of",
    "pencils",
    "sample_array",
    "time_fft3d",
    "time_pfft",
]

ORDERS = tuple("".join(p) for p in permutations("xyz"))
DEFAULT_ORDER = "zxy"
_AXIS = {"x": 0, "y": 1, "z": 2}

Pencil = Tuple[Shard, Shard]


def pencils(order: str = DEFAULT_ORDER) -> Tuple[Pencil, Pencil, Pencil]:
    """The placements of the three pencils of ``order`` (mesh dim 0, mesh dim 1)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    a, b, c = (_AXIS[ch] for ch in order)
    return (Shard(b), Shard(c)), (Shard(a), Shard(c)), (Shard(a), Shard(b))


def order_of(placements: Sequence[object]) -> Optional[str]:
    """The order whose first pencil is ``placements``, if any."""
    for order in ORDERS:
        if tuple(placements) == pencils(order)[0]:
            return order
    return None


class _Pencils:
    """The FFT from the first pencil of ``order`` to its last: pyshard.fft's cached plan with
    ``out=`` one buffer (overwritten by the next call); ``transposes``: the plan's
    transposes alone, on work buffers of their own."""

    def __init__(self, mesh: Mesh, shape: Sequence[int], dtype: Any, algorithm: str,
                 order: str) -> None:
        if mesh.ndim != 2:
            raise ValueError(f"fft3d: needs a 2-D pyshard.Mesh, got {mesh!r}")
        shape = tuple(int(n) for n in shape)
        if len(shape) != 3:
            raise ValueError(f"fft3d: needs a 3-D shape, got {shape}")
        first, _, last = pencils(order)
        self.src = Layout(shape, np.dtype(dtype), mesh.shape, first)
        self.plan = pf.plan(self.src, "fftn", placements=list(last))
        self.algorithm = algorithm
        coords = mesh.coords
        # the result's buffer as a ShardedArray of the plan's output layout: its fit is known
        # from the layout (a plain array's takes one small allreduce a call, pyshard.fft)
        self.out = ShardedArray(np.empty(self.plan.dst.local_shape(coords), self.plan.dst.dtype),
                                self.plan.dst, mesh)
        self.moves = [p for p in self.plan.passes if isinstance(p, Move) and p.plan.collectives]
        self._work = [
            (ShardedArray(np.zeros(p.src.local_shape(coords), p.src.dtype), p.src, mesh),
             p.dst, np.empty(p.dst.local_shape(coords), p.dst.dtype))
            for p in self.moves
        ]

    def __call__(self, x: ShardedArray) -> ShardedArray:
        return self.plan.forward(x, out=self.out, algorithm=self.algorithm)

    def transposes(self) -> None:
        for a, dst, buf in self._work:
            a.redistribute(list(dst.placements), dst.sizes or None, algorithm=self.algorithm,
                           out=buf)


def _tolerance(dtype: np.dtype) -> float:
    return 1e-4 if np.dtype(dtype) == np.complex64 else 1e-10


def _reference_boxes(
    comm: MPI.Comm, shape: Tuple[int, ...], boxes: List[Tuple[slice, ...]]
) -> List[np.ndarray]:
    """``numpy.fft.fftn(sample_array(shape))[box]`` for each of this rank's ``boxes``:
    computed once on rank 0 and sent (collective over ``comm``)."""
    allboxes = collectives.gather(comm, [[(s.start, s.stop) for s in b] for b in boxes])
    out = [np.empty(tuple(s.stop - s.start for s in b), np.complex128) for b in boxes]
    if comm.rank == 0:
        ref = np.fft.fftn(sample_array(shape, np.complex128))
        for r, bs in enumerate(allboxes):
            for k, b in enumerate(bs):
                blk = np.ascontiguousarray(ref[tuple(slice(a, z) for a, z in b)])
                if r == 0:
                    out[k][...] = blk
                else:
                    comm.Send(blk, dest=r, tag=k)
        del ref
    else:
        for k, o in enumerate(out):
            comm.Recv(o, source=0, tag=k)
    return out


def _close(comm: MPI.Comm, got: np.ndarray, ref: np.ndarray, dtype: np.dtype) -> bool:
    """Every rank's ``got`` matches ``ref`` to the dtype's tolerance, relative to the
    largest reference value anywhere (collective)."""
    err = float(np.max(np.abs(got - ref))) if got.size else 0.0
    big = float(np.max(np.abs(ref))) if ref.size else 0.0
    err, big = collectives.max_all(comm, err), collectives.max_all(comm, big)
    return bool(err <= _tolerance(dtype) * max(big, 1.0))


def _ms(times: List[float]) -> float:
    return float(np.median(times)) * 1e3


def _interleaved(
    fns: Dict[str, Callable[[], object]], comm: MPI.Comm, reps: int, warmup: int
) -> Dict[str, float]:
    """Median ms (slowest rank, a barrier before each run) of every function in ``fns``,
    after ``warmup`` untimed runs of each; the timed runs take turns (rep 1 of each, then
    rep 2, ...) so that a change in machine load hits every function alike (collective)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            times[k] += timed(fn, comm, 1, 0)
    return {k: _ms(v) for k, v in times.items()}


def time_fft3d(
    x: ShardedArray,
    reps: int = 5,
    warmup: int = 2,
    algorithm: str = "auto",
    order: Optional[str] = None,
) -> Dict[str, float]:
    """Median wall times (ms, slowest rank, a barrier before each rep) of the whole
    transform of ``x`` and of its two transposes alone, after ``warmup`` untimed runs of
    each, the two timed in turn; one result buffer that every rep reuses. ``order=None``:
    the order that starts from ``x``'s pencil (:func:`order_of`), else
    :data:`DEFAULT_ORDER`; an ``x`` in another layout is redistributed first, untimed.
    Collective."""
    if order is None:
        order = order_of(x.placements) or DEFAULT_ORDER
    f = _Pencils(x.mesh, x.shape, x.dtype, algorithm, order)
    if x.layout != f.src:
        x = x.redistribute(list(f.src.placements), algorithm=algorithm)
    t = _interleaved({"total": lambda: f(x), "transposes": f.transposes}, x.mesh.comm, reps, warmup)
    return {"total_ms": t["total"], "transposes_ms": t["transposes"]}


def import_pfft() -> Tuple[Any, str]:
    """(mpi4py_fft.PFFT or None, its version or why it did not import)."""
    try:
        import mpi4py_fft
        from mpi4py_fft import PFFT
    except Exception as e:  # ImportError, or a broken build
        return None, f"mpi4py_fft does not import ({type(e).__name__}: {e})"
    return PFFT, f"mpi4py-fft {getattr(mpi4py_fft, '__version__', '?')}"


class _Pfft:
    """mpi4py-fft's ``PFFT`` (``backend="numpy"``, ``grid=(P0, P1, 1)``: axis 2 whole on
    input; it transforms axis 2, then 1, then 0) holding :func:`sample_array` in its input.
    ``transform`` is its forward transform unnormalised (as numpy.fft.fftn);
    ``transfers`` runs its two ``Transfer`` objects alone (``Alltoallw`` with subarray
    datatypes) on its own stage arrays."""

    def __init__(
        self,
        PFFT: Any,
        comm: MPI.Comm,
        shape: Tuple[int, ...],
        mesh_shape: Sequence[int],
        dtype: np.dtype,
    ) -> None:
        with np.errstate(invalid="ignore", over="ignore"):  # it plans on uninitialised arrays
            self.fft = PFFT(
                comm, shape, axes=(0, 1, 2), dtype=dtype, grid=(*mesh_shape, 1), backend="numpy"
            )
        f = self.fft
        f.forward.input_array[...] = sample_array(shape, dtype, f.local_slice(False))
        self._pairs = [
            (t, f.xfftn[i].forward.output_array, f.xfftn[i + 1].forward.input_array)
            for i, t in enumerate(f.transfer)
        ]

    def transform(self) -> np.ndarray:
        return self.fft.forward(normalize=False)

    def transfers(self) -> None:
        for t, a, b in self._pairs:
            t.forward(a, b)

    def output_box(self) -> Tuple[slice, ...]:
        return tuple(self.fft.local_slice(True))

    def destroy(self) -> None:
        self.fft.destroy()


def _make_pfft(
    comm: MPI.Comm, shape: Tuple[int, ...], mesh_shape: Sequence[int], dtype: np.dtype
) -> Tuple[Optional[_Pfft], str]:
    """(a :class:`_Pfft`, its version) where mpi4py_fft imports on every rank, else
    (None, why); collective."""
    PFFT, why = import_pfft()
    if not collectives.all_true(comm, PFFT is not None):
        if PFFT is not None:
            why = "mpi4py_fft does not import on every rank"
        return None, why
    return _Pfft(PFFT, comm, shape, mesh_shape, dtype), why


def time_pfft(
    comm: MPI.Comm,
    shape: Sequence[int],
    mesh_shape: Tuple[int, int],
    dtype: object = np.complex128,
    reps: int = 5,
    warmup: int = 2,
    check: bool = True,
) -> Dict[str, Any]:
    """mpi4py-fft's PFFT on :func:`sample_array` of ``shape``, timed as
    :func:`time_fft3d`: the whole forward transform and its two transfers alone; with
    ``check`` its result is compared with ``numpy.fft.fftn``. ``{"pfft": None, "why": ...}``
    when mpi4py_fft does not import (collective)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    p, why = _make_pfft(comm, shape, mesh_shape, dtype)
    if p is None:
        return {"pfft": None, "why": why}
    try:
        res: Dict[str, Any] = {"pfft": why, "check": None}
        if check:
            got = p.transform()
            (ref,) = _reference_boxes(comm, shape, [p.output_box()])
            res["check"] = _close(comm, got, ref, dtype)
            del ref
        t = _interleaved({"total": p.transform, "transposes": p.transfers}, comm, reps, warmup)
        res["total_ms"], res["transposes_ms"] = t["total"], t["transposes"]
        return res
    finally:
        p.destroy()


def _mesh2d(p: int) -> Tuple[int, int]:
    a, b = MPI.Compute_dims(p, 2)
    return int(a), int(b)


def bench_fft3d(
    comm: MPI.Comm,
    n: int = 256,
    reps: int = 5,
    warmup: int = 2,
    mesh_shape: Optional[Tuple[int, int]] = None,
    dtype: object = np.complex128,
    algorithm: str = "auto",
    pfft: bool = True,
    order: str = DEFAULT_ORDER,
) -> Dict[str, Any]:
    """The ``fft3d`` bench row (JSON-able): pyshard's pencil FFT of an ``n^3`` array on a
    2-D mesh over ``comm`` (``MPI.Compute_dims`` unless ``mesh_shape``), and mpi4py-fft's
    PFFT on the same array when it imports (and ``pfft``); both checked against
    ``numpy.fft.fftn`` (computed once, on rank 0). Times are medians of ``reps`` in ms on
    the slowest rank, the transform and its transposes alone, the four timed in turn
    after ``warmup`` runs of each. PFFT columns are None when mpi4py_fft is missing
    (``pfft`` says why). ``check``: every result that ran matches. ``order``: pyshard's
    pencil order (:func:`pencils`); PFFT always starts from ``[Shard(0), Shard(1)]``
    (``grid=(P0, P1, 1)``) and transforms axes 2, 1, 0. Collective."""
    mesh_shape = tuple(int(m) for m in mesh_shape) if mesh_shape else _mesh2d(comm.size)
    shape = (int(n),) * 3
    dtype = np.dtype(dtype)
    row: Dict[str, Any] = {
        "case": "fft3d",
        "ranks": comm.size,
        "mesh": list(mesh_shape),
        "shape": list(shape),
        "dtype": dtype.name,
        "algorithm": algorithm,
        "order": order,
        "pencils": [[str(q) for q in pl] for pl in pencils(order)],
        "reps": reps,
        "pyshard_total_ms": None,
        "pyshard_transposes_ms": None,
        "pyshard_check": None,
        "pfft": "not run",
        "pfft_total_ms": None,
        "pfft_transposes_ms": None,
        "pfft_check": None,
    }
    mesh = Mesh(comm, mesh_shape)
    p: Optional[_Pfft] = None
    try:
        f = _Pencils(mesh, shape, dtype, algorithm, order)
        lay = f.src
        x = ShardedArray(sample_array(shape, dtype, lay.box(mesh.coords)), lay, mesh)
        fns: Dict[str, Callable[[], object]] = {
            "pyshard_total": lambda: f(x),
            "pyshard_transposes": f.transposes,
        }
        if pfft:
            p, row["pfft"] = _make_pfft(comm, shape, mesh_shape, dtype)
        boxes = [f(x).box] + ([p.output_box()] if p is not None else [])
        refs = _reference_boxes(comm, shape, boxes)
        row["pyshard_check"] = _close(comm, f(x).local, refs[0], dtype)
        if p is not None:
            row["pfft_check"] = _close(comm, p.transform(), refs[1], dtype)
            fns["pfft_total"] = p.transform
            fns["pfft_transposes"] = p.transfers
        del refs
        for k, v in _interleaved(fns, comm, reps, warmup).items():
            row[f"{k}_ms"] = v
    finally:
        if p is not None:
            p.destroy()
        mesh.free()
    row["check"] = bool(row["pyshard_check"] and row["pfft_check"] is not False)
    if row["pfft_total_ms"]:
        row["total_vs_pfft"] = row["pyshard_total_ms"] / row["pfft_total_ms"]
        row["transposes_vs_pfft"] = row["pyshard_transposes_ms"] / row["pfft_transposes_ms"]
    return row


def format_fft3d(row: Dict[str, Any]) -> str:
    """A few human-readable lines for a :func:`bench_fft3d` row."""
    head = (
        f"fft3d {'x'.join(map(str, row['shape']))} {row['dtype']} on {row['ranks']} ranks, "
        f"mesh {'x'.join(map(str, row['mesh']))}, order {row['order']} "
        f"({' -> '.join('[' + ', '.join(q) + ']' for q in row['pencils'])}), "
        f"median of {row['reps']}"
    )
    lines = [head, f"{'':<22}{'total ms':>10}{'transposes ms':>15}  check"]
    lines.append(
        f"{'pyshard':<22}{row['pyshard_total_ms']:>10.1f}{row['pyshard_transposes_ms']:>15.1f}"
        f"  {row['pyshard_check']}"
    )
    if row["pfft_total_ms"] is None:
        lines.append(f"PFFT: {row['pfft']}")
    else:
        lines.append(
            f"{'PFFT (numpy backend)':<22}{row['pfft_total_ms']:>10.1f}"
            f"{row['pfft_transposes_ms']:>15.1f}  {row['pfft_check']}"
        )
        lines.append(
            f"pyshard / PFFT: total {row['total_vs_pfft']:.2f}x, "
            f"transposes {row['transposes_vs_pfft']:.2f}x"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- test data


def sample_array(
    shape: Sequence[int], dtype: object = np.complex128, box: Optional[Sequence[slice]] = None
) -> np.ndarray:
    """A deterministic pseudo-random complex array of global ``shape`` (values in
    [-0.5, 0.5) + i[-0.5, 0.5)), or only its region ``box``: every rank can build its own
    shard without the global array. Values hash the global flat index."""
    shape = tuple(int(n) for n in shape)
    if box is None:
        box = tuple(slice(0, n) for n in shape)
    idx = [np.arange(s.start, s.stop, dtype=np.uint64) for s in box]
    flat = np.zeros([len(i) for i in idx], dtype=np.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[d] = len(idx[d])
        flat += idx[d].reshape(view) * np.uint64(stride)
        stride *= shape[d]
    out = np.empty(flat.shape, np.dtype(dtype))
    scale = 1.0 / (1 << 24)
    h = (flat * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    out.real = h * scale - 0.5
    flat += np.uint64(0x632BE59BD9B4E019)
    h = (flat * np.uint64(0xC2B2AE3D27D4EB4F)) >> np.uint64(40)
    out.imag = h * scale - 0.5
    return out
