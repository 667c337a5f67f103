"""A distributed 3-D FFT with pencil decomposition on a 2-D mesh: an application benchmark.

A *pencil* holds one axis whole on every rank; the two mesh dims split the other two. With
``order`` the axes in the order they are transformed (``"xyz"``: axis 0, then 1, then 2;
x, y, z name axes 0, 1, 2), on a ``P0 x P1`` mesh:

1. pencil 0: axis ``a`` whole, mesh dim 0 splits axis ``b``, mesh dim 1 splits axis ``c``;
   every rank runs ``numpy.fft.fft`` along axis ``a``;
2. transpose 1, on mesh dim 0 (its P0-rank groups): mesh dim 0 splits ``a`` instead of
   ``b``; FFT along ``b``;
3. transpose 2, on mesh dim 1: mesh dim 1 splits ``b`` instead of ``c``; FFT along ``c``.

Each transpose is one pyshard redistribution: one collective on one mesh dim's
sub-communicator. ``"xyz"`` goes ``[Shard(1), Shard(2)] -> [Shard(0), Shard(2)] ->
[Shard(0), Shard(1)]``; ``"zxy"`` goes ``[Shard(0), Shard(1)] -> [Shard(2), Shard(1)] ->
[Shard(2), Shard(0)]``. Every ordered pair of sharded axes is the input of exactly one order,
so :func:`fft3d` transforms any pencil without an extra redistribution.

An exchange copies blocks out of (pack) or into (unpack) the local array wherever the axis
it splits is not the outermost one there (axis 0 gives contiguous blocks, axis 1 long runs,
axis 2 rows of the fastest axis). ``"zxy"`` (the default) and ``"yxz"`` copy on one side of
each exchange, ``"xyz"``'s second exchange on both. Measured at 4 ranks (2 cores), 256^3
complex128, interleaved: transposes 104 ms for ``"zxy"`` and ``"yxz"``, 113 for ``"xyz"``,
117 to 128 for the other three; the whole transform 269 ms for ``"zxy"`` against 335 for
``"xyz"``, mostly because its first FFT (the one that cannot run in place, the input is
left alone) is along the contiguous axis.

The transform itself is :mod:`pyshard.fft`'s: a cached :func:`pyshard.fft.plan` of ``fftn``
from the first pencil to the last (the planner picks exactly the two transposes above: each
moves the Shard of the axis to transform next onto the one just transformed, where the target
pencil wants it), run with ``out=`` this object's last buffer (the last transpose writes
into it and the last FFT runs there in place). Where a mesh dim has size 1 its transpose
moves nothing.

:class:`PencilFFT3D` owns its buffers and reuses them on every call (its result is
overwritten by the next call); :func:`fft3d` is the one-shot form. :func:`sample_array`
builds any rank's box of a deterministic test array. The benchmark that times it next to
mpi4py-fft's ``PFFT`` is :mod:`pyshard.bench.fft3d`.
"""

from __future__ import annotations

from itertools import permutations
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .. import fft as _pfft
from ..array import ShardedArray
from ..layout import Layout, Shard
from ..mesh import Mesh
from ..plan import Plan, plan

__all__ = [
    "DEFAULT_ORDER",
    "ORDERS",
    "PencilFFT3D",
    "fft3d",
    "order_of",
    "pencils",
    "sample_array",
]

ORDERS = tuple("".join(p) for p in permutations("xyz"))
DEFAULT_ORDER = "zxy"
_AXIS = {"x": 0, "y": 1, "z": 2}

_COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))

Pencil = Tuple[Shard, Shard]


def _axes(order: str) -> Tuple[int, int, int]:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    a, b, c = (_AXIS[ch] for ch in order)
    return a, b, c


def pencils(order: str = DEFAULT_ORDER) -> Tuple[Pencil, Pencil, Pencil]:
    """The placements of the three pencils of ``order`` (mesh dim 0, mesh dim 1)."""
    a, b, c = _axes(order)
    return (Shard(b), Shard(c)), (Shard(a), Shard(c)), (Shard(a), Shard(b))


def order_of(placements: Sequence[object]) -> Optional[str]:
    """The order whose first pencil is ``placements``, if any."""
    for order in ORDERS:
        if tuple(placements) == pencils(order)[0]:
            return order
    return None


def _one_collective(p: Plan) -> bool:
    """``p`` is one collective on one mesh dim's sub-communicator."""
    return p.collectives == 1 and len(p.steps) == 1 and len(p.steps[0].mesh_dims) == 1


class PencilFFT3D:
    """The forward 3-D FFT (unnormalised, like ``numpy.fft.fftn``) of complex arrays of
    ``shape`` on a 2-D ``mesh``, from the first pencil of ``order`` to its last
    (:func:`pencils`; ``input_placements``, ``output_placements``).

    Building it allocates three work buffers (one per pencil) and plans both transposes;
    every call reuses them, so the array a call returns is overwritten by the next call.
    ``algorithm`` is passed to :meth:`ShardedArray.redistribute`.
    """

    def __init__(
        self,
        mesh: Mesh,
        shape: Sequence[int],
        dtype: object = np.complex128,
        algorithm: str = "auto",
        order: str = DEFAULT_ORDER,
    ) -> None:
        if not isinstance(mesh, Mesh) or mesh.ndim != 2:
            raise ValueError(f"PencilFFT3D: needs a 2-D pyshard.Mesh, got {mesh!r}")
        shape = tuple(int(n) for n in shape)
        if len(shape) != 3:
            raise ValueError(f"PencilFFT3D: needs a 3-D shape, got {shape}")
        dtype = np.dtype(dtype)
        if dtype not in _COMPLEX:
            raise TypeError(f"PencilFFT3D: dtype must be complex64 or complex128, got {dtype}")
        self.axes = _axes(order)
        self.order = order
        self.mesh = mesh
        self.shape = shape
        self.dtype = dtype
        self.algorithm = algorithm
        self.layouts = tuple(Layout(shape, dtype, mesh.shape, p) for p in pencils(order))
        self.plans = (
            plan(self.layouts[0], self.layouts[1]),
            plan(self.layouts[1], self.layouts[2]),
        )
        coords = mesh.coords
        # transpose k runs on mesh dim k; where that has size 1 the two axes it swaps are
        # whole on every rank, so nothing moves: relabel the same buffer (decided from the
        # mesh and layouts alone, the same on every rank)
        self._moves = tuple(p.collectives > 0 or m > 1 for p, m in zip(self.plans, mesh.shape))
        for p, moves in zip(self.plans, self._moves):
            if moves and not _one_collective(p):  # pragma: no cover - a planner regression
                raise AssertionError(f"PencilFFT3D: a transpose is not one collective: {p}")
        bufs: List[np.ndarray] = [np.empty(self.layouts[0].local_shape(coords), dtype)]
        for lay, moves in zip(self.layouts[1:], self._moves):
            bufs.append(np.empty(lay.local_shape(coords), dtype) if moves else bufs[-1])
        self._arrays = tuple(ShardedArray(b, lay, mesh) for b, lay in zip(bufs, self.layouts))
        self.fft_plan = _pfft.plan(
            self.layouts[0], "fftn", placements=list(self.layouts[2].placements)
        )

    def __repr__(self) -> str:
        return (
            f"PencilFFT3D({self.shape}, {self.dtype}, mesh {self.mesh.shape}, order "
            f"{self.order!r}, transposes {[str(p) for p in self.plans]})"
        )

    @property
    def input_placements(self) -> Pencil:
        return self.layouts[0].placements

    @property
    def output_placements(self) -> Pencil:
        return self.layouts[2].placements

    def _transpose(self, i: int) -> None:
        if self._moves[i]:
            a, b = self._arrays[i], self._arrays[i + 1]
            a.redistribute(b.placements, algorithm=self.algorithm, out=b.local)

    def transposes(self) -> None:
        """Run the two transposes alone on the work buffers (collective; for timing)."""
        self._transpose(0)
        self._transpose(1)

    def __call__(self, x: ShardedArray) -> ShardedArray:
        """The FFT of ``x`` (laid out as ``input_placements``) laid out as
        ``output_placements``, in this object's last buffer; collective over the mesh."""
        if x.layout != self.layouts[0]:
            raise ValueError(
                f"PencilFFT3D: expected {self.layouts[0]}, got {x.layout}; redistribute to "
                f"{list(self.input_placements)} first (or call fft3d)"
            )
        out = self._arrays[2]
        return self.fft_plan.forward(x, out=out.local, algorithm=self.algorithm)


def fft3d(x: ShardedArray, algorithm: str = "auto", order: Optional[str] = None) -> ShardedArray:
    """The 3-D FFT (``numpy.fft.fftn`` of the global array) of a complex array on a 2-D mesh,
    as a new array; collective over ``x.mesh``.

    ``order=None``: when ``x`` is a pencil (two Shard placements of distinct axes, balanced
    splits) the order that starts from it, so no extra redistribution is needed (x-pencils
    ``[Shard(1), Shard(2)]`` give ``"xyz"``, ending in ``[Shard(0), Shard(1)]``); any
    other layout is first redistributed to :data:`DEFAULT_ORDER`'s input. The result's
    placements are the order's last pencil (:func:`pencils`). For repeated transforms of
    one shape, build a :class:`PencilFFT3D` once: it reuses its buffers.
    """
    if order is None:
        order = order_of(x.placements) or DEFAULT_ORDER
    f = PencilFFT3D(x.mesh, x.shape, x.dtype, algorithm, order)
    if x.layout != f.layouts[0]:
        x = x.redistribute(f.input_placements, algorithm=algorithm)
    return f(x)


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
