"""Checkpoint jobs run under their own mpiexec, and the helpers the checkpoint tests share.

Usage: ``mpiexec -n N python ckpt_worker.py JOBS`` where JOBS is a JSON list of jobs, each
``{"op": "save" | "load", "path": ..., "mesh": [..], "arrays": {name: spec}}`` (a save may
name its ``"format"``) with
``spec = {"shape", "dtype", "seed", "placements": ["S(0)", "R", "P(sum)"], "sizes"}``.
A save builds each array from ``oracle.make_global(shape, dtype, seed)`` in its layout
(Partial mesh dims hold contributions that reduce to it); a load loads every named array
in its layout and compares each rank's shard with the global array. Exit status 0 when every
job succeeded on every rank; rank 0 prints ``OK`` or the failures.
"""

from __future__ import annotations

import json
import os
import re
import sys
from math import prod

import numpy as np
from mpi4py import MPI
from oracle import is_ml, make_global

import pyshard as ps
from pyshard import Partial, Replicate, Shard


def parse_placement(s):
    """``"S(0)"``, ``"R"``, ``"P(sum)"`` -> placement objects."""
    m = re.fullmatch(r"S\((-?\d+)\)|R|P\((\w+)\)", s.strip())
    if m is None:
        raise ValueError(f"bad placement {s!r}")
    if s.strip() == "R":
        return Replicate()
    if m.group(1) is not None:
        return Shard(int(m.group(1)))
    return Partial(m.group(2))


def placements_of(spec):
    return [parse_placement(p) if isinstance(p, str) else p for p in spec["placements"]]


def sizes_of(spec):
    s = spec.get("sizes")
    return None if s is None else {int(k): list(v) for k, v in s.items()}


def global_of(spec):
    return make_global(tuple(spec["shape"]), spec["dtype"], seed=spec.get("seed", 0))


def make_sharded(mesh, spec):
    """A ShardedArray of ``global_of(spec)`` in the spec's layout on ``mesh``.

    Partial(sum) mesh dims hold distinct contributions whose reduction is exactly the
    global array (differences for numbers, subsets for bool).
    """
    g = global_of(spec)
    placements = placements_of(spec)
    sizes = sizes_of(spec)
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if not pdims:
        return ps.distribute(g, mesh, placements, sizes)
    assert all(placements[m].op == "sum" for m in pdims), "only Partial(sum) sources"
    layout = ps.Layout(g.shape, g.dtype, mesh.shape, placements, sizes)
    nq = prod(mesh.shape[m] for m in pdims)
    seed = spec.get("seed", 0)
    others = [make_global(g.shape, g.dtype, seed=seed + 17 * (q + 1)) for q in range(nq - 1)]
    if is_ml(g.dtype):
        # bfloat16, float8: differences would round; halves, quarters, ... of g sum to it
        # exactly (each is g with a smaller exponent), in any order
        parts = [g * 0.5 ** min(q + 1, nq - 1) for q in range(nq)] if nq > 1 else [g]
        parts = [np.asarray(x, g.dtype) for x in parts]
    elif g.dtype.kind == "b":
        parts = [g] + [o & g for o in others]
    else:
        parts = [g - sum(others) if others else g] + others
    q = 0
    for m in pdims:
        q = q * mesh.shape[m] + mesh.coords[m]
    local = np.ascontiguousarray(parts[q][layout.box(mesh.coords)])
    return ps.from_local(local, mesh, placements, global_shape=g.shape, sizes=sizes)


def expected_local(layout, coords, g):
    """What a rank at ``coords`` holds of ``g`` in ``layout`` (zeros off coord 0 of P(sum))."""
    want = np.asarray(g[layout.box(coords)])
    zero = any(
        isinstance(p, Partial) and p.op == "sum" and coords[m] != 0
        for m, p in enumerate(layout.placements)
    )
    return np.zeros_like(want) if zero else want


def check_loaded(name, y, g, where=""):
    """A failure message, or None when ``y`` is ``g`` in its layout on this rank."""
    coords = y.mesh.coords
    want = expected_local(y.layout, coords, g)
    got = np.asarray(y.local).reshape(y.layout.local_shape(coords))  # 0-d arrays too
    if y.dtype != g.dtype or y.global_shape != g.shape:
        return f"{where}{name}: loaded {y.global_shape} {y.dtype}, expected {g.shape} {g.dtype}"
    if got.dtype != g.dtype or not np.array_equal(got, want):
        return f"{where}{name}: rank {y.mesh.rank} at {coords} holds wrong data in {y.layout}"
    return None


def run_job(comm, job):
    mesh = ps.Mesh(comm, tuple(job["mesh"]))
    arrays = job["arrays"]
    if job["op"] == "save":
        ps.save(
            job["path"],
            {n: make_sharded(mesh, s) for n, s in arrays.items()},
            job.get("metadata"),
            format=job.get("format", "npy"),
        )
        return []
    placements = {n: placements_of(s) for n, s in arrays.items()}
    sizes = {n: sizes_of(s) for n, s in arrays.items() if s.get("sizes") is not None}
    out = ps.load(job["path"], mesh, placements, sizes)
    bad = [check_loaded(n, out[n], global_of(s), f"{job['path']}: ") for n, s in arrays.items()]
    return [b for b in bad if b]


def _die(what, rank):
    sys.stderr.write(f"ckpt_worker: CKPT_FAULT={what}: rank {rank} exits now\n")
    sys.stderr.flush()
    # MPI_Abort ends the whole job at once (a bare exit left the launcher to notice the dead
    # rank, and under a nested mpiexec it sometimes never did)
    MPI.COMM_WORLD.Abort(3)
    os._exit(3)


def inject_faults(spec, rank):
    """CKPT_FAULT=point:rank[,point:rank...]: the rank dies at that point of ps.save, through
    the functions the formats' saves call there (the library has no fault hook of its own):
    save-after-data (the data written, before the manifest and the renames), save-before-rename
    (the manifest written, before the first rename), save-mid-rename (between the renames of
    the old checkpoint away and the new one in)."""
    from pyshard.checkpoint import saving

    points = {p.strip().partition(":")[0] for p in spec.split(",")
              if p.strip().partition(":")[2].strip() == str(rank)}
    if "save-after-data" in points:
        finish = saving.finish  # every format's save calls it once its data is written

        def dying_finish(*a, **k):
            _die("save-after-data", rank)
            return finish(*a, **k)

        saving.finish = dying_finish
    renames = [0]
    die_at = 1 if "save-before-rename" in points else 2 if "save-mid-rename" in points else 0
    if die_at:
        rename = os.rename

        def dying_rename(*a, **k):
            renames[0] += 1
            if renames[0] == die_at:
                _die("save-before-rename" if die_at == 1 else "save-mid-rename", rank)
            return rename(*a, **k)

        os.rename = dying_rename


def main(argv):
    comm = MPI.COMM_WORLD
    inject_faults(os.environ.get("CKPT_FAULT", ""), comm.rank)
    jobs = json.loads(argv[0])
    failures = []
    for job in jobs:
        failures += run_job(comm, job)
    everyone = comm.gather(failures, root=0)
    ok = comm.bcast(not any(everyone) if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        if ok:
            print(f"OK {len(jobs)} job(s) on {comm.size} rank(s)")
        else:
            for r, fs in enumerate(everyone):
                for f in fs:
                    print(f"[rank {r}] {f}")
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
