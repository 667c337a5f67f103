"""One routing rule (pyshard/route.py): what explain() says about each step is what runs.

For random layout pairs on several meshes, with the node-shared memory threshold at 0, at
its default and out of reach, and with node-shared memory off: ``plan.explain(mesh=mesh)``
names, per step, the path :func:`pyshard.route.route` takes; the redistribute then counts
exactly that many steps on node-shared memory (``comm_stats``, counted by the core) and the
rest on MPI, and the result equals numpy's. Independently of the rule: with node-shared
memory off no step takes it, and with the threshold at 0 on one node every collective step
of a host array does. The rule in words (``describe``, explain() without a mesh) agrees too.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_redistribute_nd import counts_since

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.route import describe, route

pytestmark = pytest.mark.mpi

MESHES = {1: [(1,)], 2: [(2,), (1, 2)], 3: [(3,)], 4: [(4,), (2, 2)], 6: [(6,), (2, 3)],
          7: [(7,)], 8: [(8,), (2, 2, 2), (4, 2)]}  # fmt: skip


def placement(rng, ndim, partial):
    r = rng.random()
    if partial and r < 0.25:
        return Partial(rng.choice(["sum", "max"]))
    if r < 0.5:
        return Replicate()
    return Shard(rng.randrange(ndim))


@pytest.mark.parametrize("threshold", [0, None, 1 << 40, "off"])
def test_explain_names_the_path_that_runs(comm, threshold):
    rng = random.Random(77 + comm.size)
    settings = {"PYSHARD_TRANSPORT": "mpi"} if threshold == "off" else {
        "PYSHARD_TRANSPORT": "auto", "PYSHARD_SHM_MIN_BYTES": threshold}  # fmt: skip
    one_node = ps.config.get("PYSHARD_NODE_SIZE") is None
    bad = []
    with ps.config.override(**settings):
        for mshape in MESHES.get(comm.size, [(comm.size,)]):
            mesh = ps.Mesh(comm, mshape)
            for _ in range(8):
                ndim = rng.choice((1, 2, 3))
                shape = tuple(rng.randrange(1, 3 * comm.size + 5) for _ in range(ndim))
                src = [placement(rng, ndim, True) for _ in mshape]
                dst = [placement(rng, ndim, False) for _ in mshape]
                g = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
                x = ps.distribute(g, mesh, src)
                p = x.plan_to(dst)
                routes = [route(s, mesh, "auto") for s in p.steps]
                text = p.explain(mesh=mesh)
                said = [ln.split("on this mesh: ")[1] for ln in text.splitlines()
                        if "on this mesh: " in ln]  # fmt: skip
                want = [r.path + (f" ({r.algorithm})" if r.algorithm not in ("", r.path) else "")
                        for r in routes]  # fmt: skip
                before = ps.comm_stats()
                y = x.redistribute(dst)
                got = counts_since(before)
                shm = sum(r.path == "shm" for r in routes)
                case = f"{mshape} {shape} {src} -> {dst}"
                if said != want:
                    bad.append(f"{case}: explain says {said}, route {want}")
                if got.get("shm", 0) != shm or sum(got.values()) != p.collectives:
                    bad.append(f"{case}: ran {got}, route says {shm} on shm of {p.collectives}")
                if threshold == "off" and shm:
                    bad.append(f"{case}: node-shared memory is off, {shm} step(s) took it")
                if threshold == 0 and one_node and comm.size > 1 and shm != p.collectives:
                    bad.append(f"{case}: one node, threshold 0: {shm} of {p.collectives} on shm")
                for s, r in zip(p.steps, routes):
                    words = describe(s)
                    if threshold != "off" and words is not None:
                        if r.path == "shm" and not words.startswith("node-shared memory"):
                            bad.append(f"{case}: {s.kind} takes shm, describe says {words}")
                        if words.startswith("MPI") and r.path == "shm":
                            bad.append(f"{case}: {s.kind}: describe says MPI, route shm")
                if not np.array_equal(y.local, g[y.box]):  # (distribute: Partial sums to g)
                    bad.append(f"{case}: wrong result")
            mesh.free()
    assert not bad, "\n".join(bad[:10])

