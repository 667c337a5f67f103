"""The ``sparse`` bench case: one rank's setup of a redistribution that touches one peer,
simulated on meshes of up to 65,536 ranks without MPI: it grows with the peers, not the
ranks."""

from __future__ import annotations

import time
from typing import Any, Dict, Sequence

import numpy as np

from .. import _core
from ..geometry import exchange_specs, geometry
from ..layout import Layout, Shard
from ..planner import plan as make_plan


def bench_sparse_setup(
    sides: Sequence[int] = (16, 64, 256), n: int = 4096, coords_frac: float = 0.5
) -> Dict[str, Any]:
    """Simulate one rank of the 2-D swap ``[S0,S1] -> [S1,S0]`` of an ``n x n`` array on
    ``side x side`` meshes (up to 65,536 ranks), without MPI: the time to plan, find its
    blocks, build the core's point-to-point geometry and explain the step, next to the
    peers it touches. The setup grows with the peers (one), not with the ranks."""
    rows = []
    for side in sides:
        mesh = (side, side)
        src = Layout((n, n), np.float32, mesh, [Shard(0), Shard(1)])
        dst = Layout((n, n), np.float32, mesh, [Shard(1), Shard(0)])
        me = (int(side * coords_frac), int(side * coords_frac * 0.5))
        best = float("inf")
        for _ in range(3):  # the best of 3, each from scratch (no plan cache)
            t0 = time.perf_counter()
            p = make_plan.__wrapped__(src, dst)
            step = p.steps[0]
            peers = step.max_peers()
            g = geometry(step, me, _core.Algorithm.p2p)
            sends, recvs, _ = exchange_specs(step, me)
            best = min(best, time.perf_counter() - t0)
        rows.append(
            {
                "ranks": side * side,
                "mesh": list(mesh),
                "max_peers": peers,
                "sends": len(sends),
                "recvs": len(recvs),
                "descriptors": int(g.descriptors),
                "setup_ms": 1e3 * best,
                "auto": "p2p" if 4 * peers <= side * side else "alltoallv",
            }
        )
    return {"case": "sparse", "array": [n, n], "rows": rows}


def format_sparse(r: Dict[str, Any]) -> str:
    """A few lines for a :func:`bench_sparse_setup` row."""
    lines = [f"sparse: one rank of the 2-D swap [S0,S1] -> [S1,S0] of {r['array']}, no MPI"]
    for row in r["rows"]:
        lines.append(
            f"  {row['ranks']:>6} ranks: {row['max_peers']} peer(s) at most, this rank sends "
            f"{row['sends']} and receives {row['recvs']} block(s), {row['descriptors']} "
            f"descriptor(s), setup {row['setup_ms']:.2f} ms, auto -> {row['auto']}"
        )
    return "\n".join(lines)
