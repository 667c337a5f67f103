"""The host benchmark of one case: pyshard next to its communication floors and the
hand-written mpi4py + numpy baseline, in the same run and on the same communicator.

pyshard is ``x.redistribute(target, algorithm=..., out=buf)`` with a cached plan (and the
same returning a new array, "plain"); the floors and baseline are
:class:`~pyshard.bench.floors.HostReference`'s. Times are the median and minimum over
``reps`` of the slowest rank (a barrier before each rep, the maximum over ranks after).
"""

from __future__ import annotations

from math import prod
from typing import Dict

import numpy as np
from mpi4py import MPI

from .. import _core, _mpi, collectives
from ..array import ShardedArray, executors, from_local
from ..layout import Layout
from ..mesh import Mesh
from ..planner import Plan, Step
from .cases import Case
from .floors import HostReference
from .timing import timed


def _source(case: Case, mesh: Mesh, dtype: np.dtype) -> ShardedArray:
    layout = Layout(case.shape, dtype, mesh.shape, case.src, case.src_sizes)
    shp = layout.local_shape(mesh.coords)
    rng = np.random.default_rng(1234 + mesh.rank)
    # Floats: small integers, so that a reduction's sum is exact in any order (up to 3 x
    # ranks: exact in float16 to 682 ranks, in float32 to millions). The check compares
    # pyshard's result with the raw collective's bit for bit, and two collectives may sum in
    # different orders (Open MPI's Reduce_scatter does).
    high = 4 if dtype.kind in "fc" else 100
    local = rng.integers(0, high, size=shp).astype(dtype)
    return from_local(local, mesh, case.src, global_shape=case.shape, sizes=case.src_sizes)


def _peak_extra(p: Plan, mesh: Mesh, algorithm: str) -> int:
    """Bytes allocated beyond the input and the final output: pack/unpack workspace of
    the core objects, plus intermediate results of multi-step plans."""
    execs = executors(p, mesh, algorithm)
    peak, held = 0, 0
    for i, e in enumerate(execs):
        last = i == len(execs) - 1
        out = 0 if last or e.step.kind == "relabel" else prod(e.out_shape) * p.src.dtype.itemsize
        ws = getattr(e.core, "workspace_bytes", 0) if e.core is not None else 0
        ws = ws if isinstance(ws, int) else 0
        peak = max(peak, held + out + ws)
        held = out
    return peak


# the raw collective each pyshard collective corresponds to (the "same-collective" floor)
_SAME_FLOOR = {
    "alltoallv": "Alltoallv", "p2p": "Alltoallv", "alltoallw": "Alltoallv",
    "alltoall": "Alltoall", "allgatherv": "Allgatherv", "allgather": "Allgather",
    "reduce_scatter": "Reduce_scatter", "reduce_scatter_block": "Reduce_scatter_block",
}  # fmt: skip


def _called(x: ShardedArray, case: Case, algorithm: str) -> str:
    """The collective one pyshard call of this case makes (by comm_stats)."""
    before = _backend_stats()
    x.redistribute(case.dst, algorithm=algorithm)
    after = _backend_stats()
    got = [k for k in after if after[k] != before.get(k, 0) and k in _SAME_FLOOR]
    return got[0] if got else ""


def _backend_stats() -> Dict[str, int]:
    return dict(_core.stats())


def run_case(
    case: Case, comm: MPI.Comm, dtype: np.dtype, reps: int, warmup: int, algorithm: str
) -> Dict:
    """Time one case (pyshard, floor, baseline) and check pyshard against the baseline."""
    mesh = Mesh(comm, case.mesh_shape)
    x = _source(case, mesh, dtype)
    p = x.plan_to(case.dst)
    y = x.redistribute(case.dst, algorithm=algorithm)  # builds plan and core objects
    coll = [s for s in p.steps if s.is_collective] or [s for s in p.steps if s.kind != "relabel"]
    if not coll:  # nothing to do (one rank, same layout): compare with a plain copy
        coll = [Step("local_copy", (), p.src, p.dst)]
    if len(coll) != 1:
        raise ValueError(f"bench case {case.name}: expected a one-step plan, plan is {p}")
    ref = HostReference(coll[0], mesh, x.local)
    base_out = ref.baseline()
    ok = bool(np.array_equal(base_out, y.local))
    y2 = x.redistribute(case.dst, algorithm=algorithm, out=np.empty_like(y.local))
    ok = ok and bool(np.array_equal(y2.local, y.local))
    ok = collectives.all_true(comm, ok)
    del y, y2, base_out
    out = np.empty(p.dst.local_shape(mesh.coords), dtype)
    t_ps = timed(
        lambda: x.redistribute(case.dst, algorithm=algorithm, out=out), comm, reps, warmup
    )
    t_plain = timed(lambda: x.redistribute(case.dst, algorithm=algorithm), comm, reps, warmup)
    floors = {k: float(np.median(timed(f, comm, reps, warmup))) for k, f in ref.floors.items()}
    fastest = min(floors, key=floors.get)
    same = _SAME_FLOOR.get(_called(x, case, algorithm), fastest)
    t_base = timed(ref.baseline, comm, reps, warmup)
    sent = max((b[0] for b in p.rank_bytes(mesh.coords)), default=0)
    sent = collectives.max_all(comm, sent)
    peak = collectives.max_all(comm, _peak_extra(p, mesh, algorithm))
    local_bytes = collectives.max_all(comm, x.local.nbytes)
    med, base = float(np.median(t_ps)), float(np.median(t_base))
    flo, same_flo = floors[fastest], floors.get(same, floors[fastest])
    plain = float(np.median(t_plain))
    return {
        "case": case.name,
        "shape": list(case.shape),
        "dtype": str(dtype),
        "ranks": comm.Get_size(),
        "mesh": list(case.mesh_shape),
        "placements": [str(q) for q in case.src] + ["->"] + [str(q) for q in case.dst],
        "algorithm": algorithm,
        "collective": coll[0].kind,
        "median_s": med,
        "min_s": float(np.min(t_ps)),
        "floor_median_s": flo,
        "floor_collective": fastest,
        "ratio_to_floor": med / flo if flo > 0 else float("nan"),
        "same_floor_collective": same,
        "same_floor_median_s": same_flo,
        "ratio_to_same_floor": med / same_flo if same_flo > 0 else float("nan"),
        "floors_median_s": floors,
        "plain_median_s": plain,
        "plain_ratio_to_floor": plain / flo if flo > 0 else float("nan"),
        "baseline_median_s": base,
        "ratio_to_baseline": med / base if base > 0 else float("nan"),
        "bytes_per_rank": int(sent),
        "gbps": sent / med / 1e9 if med > 0 else 0.0,
        "peak_extra_bytes": int(peak),
        "local_bytes": int(local_bytes),
        "check": ok,
        "reps": reps,
        "mpi": _mpi.library_line(),
    }
