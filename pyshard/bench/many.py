"""``python -m pyshard bench --cases many``: many arrays changing layout together.

``--many-count`` arrays (default 200) of deterministic shapes between 64 and 1024 on each
side (float32, about 248 MiB for 200), each ``Shard(0) -> Shard(1)`` on a 1-D mesh of every
rank, timed three ways in the same run: :func:`pyshard.redistribute_many` (one fused
``MPI_Alltoallv``), a Python loop of ``redistribute`` (one collective per array), and the
floor: one raw collective of the same bytes per peer, already packed (``Alltoallv`` with the
fused exchange's counts, and ``Alltoall`` padded to the largest; the faster). Median of the
slowest rank over ``--reps``.
"""

from __future__ import annotations

from math import prod
from typing import Any, Dict, List

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..array import from_local
from ..layout import Layout, Shard
from ..many import redistribute_many
from ..mesh import Mesh
from ..planner import plan
from .timing import median_s

__all__ = ["bench_many", "format_many", "many_shapes"]


def many_shapes(count: int, scale: int = 1) -> List[tuple]:
    """``count`` deterministic shapes between 64 and 1024 per side (divided by ``scale``)."""
    return [
        (max(1, (64 + (37 * k) % 961) // scale), max(1, (64 + (91 * k + 13) % 961) // scale))
        for k in range(count)
    ]


def bench_many(comm: MPI.Comm, count: int = 200, scale: int = 1, reps: int = 5,
               warmup: int = 1) -> Dict[str, Any]:
    """Time the three ways (see the module doc); collective over ``comm``."""
    mesh = Mesh(comm, (comm.size,))
    xs = []
    for shape in many_shapes(count, scale):
        lay = Layout(shape, "float32", mesh.shape, [Shard(0)])
        xs.append(from_local(np.ones(lay.local_shape(mesh.coords), np.float32), mesh,
                             [Shard(0)], global_shape=shape))
    target = [Shard(1)]
    t_many = median_s(lambda: redistribute_many(xs, target), comm, reps, warmup)
    t_loop = median_s(lambda: [x.redistribute(target) for x in xs], comm, reps, warmup)
    # the floor: per peer, the bytes of every array's block for that peer, pre-packed
    P, me = comm.size, comm.rank
    counts = np.zeros(P, np.int64)
    for x in xs:
        step = plan(x.layout, x.layout.replace(target)).steps
        for s in step:
            for r, box in s.sends(mesh.coords):
                counts[s.group_rank(r)] += prod(b - a for a, b in box) * 4
        if not step:
            counts[me] += x.local.nbytes
    rcounts = np.array(comm.alltoall(counts.tolist()), np.int64)
    sbuf = np.ones(int(counts.sum()), np.uint8)
    rbuf = np.empty(int(rcounts.sum()), np.uint8)
    sd = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rd = np.concatenate(([0], np.cumsum(rcounts)[:-1]))
    t_v = median_s(lambda: comm.Alltoallv([sbuf, (counts, sd), MPI.BYTE],
                                          [rbuf, (rcounts, rd), MPI.BYTE]), comm, reps, warmup)
    block = int(collectives.max_all(comm, int(max(counts.max(), rcounts.max()))))
    pb, pr = np.ones(block * P, np.uint8), np.empty(block * P, np.uint8)
    t_a = median_s(lambda: comm.Alltoall(pb, pr), comm, reps, warmup)
    floor, which = (t_v, "Alltoallv") if t_v <= t_a else (t_a, "Alltoall")
    mesh.free()
    total = sum(prod(s) for s in many_shapes(count, scale)) * 4
    return {
        "case": "many", "ranks": P, "arrays": count, "bytes": total,
        "many_s": t_many, "loop_s": t_loop, "floor_s": floor, "floor": which,
        "alltoallv_s": t_v, "alltoall_s": t_a,
        "ratio_to_floor": t_many / floor, "ratio_to_loop": t_many / t_loop,
    }


def format_many(r: Dict[str, Any]) -> str:
    return (
        f"many: {r['arrays']} arrays ({r['bytes'] / 2**20:.0f} MiB float32) S(0) -> S(1) at "
        f"{r['ranks']} ranks: redistribute_many {r['many_s'] * 1e3:.1f} ms, a loop "
        f"{r['loop_s'] * 1e3:.1f} ms, floor {r['floor_s'] * 1e3:.1f} ms ({r['floor']}; "
        f"Alltoallv {r['alltoallv_s'] * 1e3:.1f}, Alltoall {r['alltoall_s'] * 1e3:.1f}): "
        f"{r['ratio_to_floor']:.2f}x the floor, {r['ratio_to_loop']:.2f}x the loop"
    )
