"""One routing rule (pyshard/route.py): the path each step of a plan takes, against the rule
as the route module's docstring and docs/site/algorithms.md state it, applied here by hand.

For random layout pairs on several meshes, with the node-shared memory threshold at 0, at
its default and out of reach, and with node-shared memory off, the test derives per step
where ``algorithm="auto"`` must take a host array: a step that is no collective stays local;
an exchange or a gather takes node-shared memory where two ranks of its communicator share a
node (an exchange: where some block of it goes between two such ranks) and its largest
block has at least the threshold (16 KiB, 256 KiB where ranks of the
communicator outnumber their machine's cores, or ``PYSHARD_SHM_MIN_BYTES``), a reduction
only where every rank of its communicator shares one node; else MPI, an exchange by ``p2p``
where every rank sends to at most a quarter of its group, else ``alltoallv``. The largest
block, the peers and the nodes come from the layouts' boxes and from the ranks' host names
and ``PYSHARD_NODE_SIZE`` (never from pyshard's node map or route()). Then
``pyshard.explain.explain(plan, mesh=mesh)`` must name those paths, route() must give them,
the redistribute must run exactly those collectives (``comm_stats``, counted by the core)
and its result must equal numpy's. Out of reach or off, nothing takes node-shared memory; at
0 on one node every collective step does. The rule in words (``describe``, explained without
a mesh) agrees too.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections import Counter
from math import prod

import numpy as np
import pytest
from mpi4py import MPI
from test_redistribute_nd import counts_since

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.explain import explain
from pyshard.route import describe, route

pytestmark = pytest.mark.mpi

MESHES = {1: [(1,)], 2: [(2,), (1, 2)], 3: [(3,)], 4: [(4,), (2, 2)], 6: [(6,), (2, 3)],
          7: [(7,)], 8: [(8,), (2, 2, 2), (4, 2)]}  # fmt: skip

# the thresholds the docs state (docs/site/algorithms.md, docs/configuration.md)
KIB16, KIB256 = 16384, 262144
REDUCTIONS = ("reduce_scatter", "allreduce")
COLLECTIVES = ("alltoallv", "allgatherv") + REDUCTIONS
# comm_stats' names for one step of each kind through MPI (regular or v-variant)
MPI_NAME = {"allgather": "allgatherv", "allgatherv": "allgatherv", "allreduce": "allreduce",
            "reduce_scatter": "reduce_scatter", "reduce_scatter_block": "reduce_scatter",
            "alltoallv": "alltoallv", "p2p": "p2p", "shm": "shm"}  # fmt: skip


def placement(rng, ndim, partial):
    r = rng.random()
    if partial and r < 0.25:
        return Partial(rng.choice(["sum", "max"]))
    if r < 0.5:
        return Replicate()
    return Shard(rng.randrange(ndim))


def overlap(a, b):
    """Elements two boxes (tuples of slices) share."""
    return prod(max(0, min(x.stop, y.stop) - max(x.start, y.start)) for x, y in zip(a, b))


def volume(box):
    return prod(s.stop - s.start for s in box)


def geometry(step):
    """(largest block in elements, most peers any rank sends to) of an exchange or gather,
    by enumerating every (sender, receiver) pair of the mesh: a receiver takes each block
    from the rank of its communicator that holds it and shares its coords on the mesh dims
    the source does not shard (its own replica); blocks to itself count as blocks."""
    src, dst, mshape = step.src, step.dst, step.src.mesh_shape
    sharding = {m for m, p in enumerate(src.placements) if isinstance(p, Shard)}
    coords = list(itertools.product(*[range(n) for n in mshape]))
    fixed = [m for m in range(len(mshape)) if m not in step.mesh_dims or m not in sharding]
    block, peers = 0, Counter()
    for r in coords:
        for s in coords:
            if all(s[m] == r[m] for m in fixed):
                v = overlap(src.box(s), dst.box(r))
                block = max(block, v)
                peers[s] += bool(v) and s != r
    return block, max(peers.values(), default=0)


def node_moves(step, mesh, group, nodes):
    """Does some block of exchange ``step`` go between two different ranks of one node of its
    communicator (mesh ranks ``group``, their nodes ``nodes``)? The pairs as geometry() takes
    them."""
    src, dst = step.src, step.dst
    sharding = {m for m, p in enumerate(src.placements) if isinstance(p, Shard)}
    fixed = [m for m in range(len(mesh.shape)) if m not in step.mesh_dims or m not in sharding]
    coords = [tuple(int(c) for c in np.unravel_index(r, mesh.shape)) for r in group]
    for i, s in enumerate(coords):
        for j, r in enumerate(coords):
            if i != j and nodes[i] == nodes[j] and all(s[m] == r[m] for m in fixed):
                if overlap(src.box(s), dst.box(r)):
                    return True
    return False


def members(mesh, dims):
    """The mesh ranks (row-major, as the comm's ranks keep their order) of this rank's
    communicator over ``dims``."""
    ranges = [range(n) if d in dims else (c,) for d, (n, c) in enumerate(zip(mesh.shape,
                                                                            mesh.coords))]
    return [int(np.ravel_multi_index(c, mesh.shape)) for c in itertools.product(*ranges)]


def expected(step, mesh, hosts, threshold):
    """(path, MPI algorithm or "") where the documented rule takes ``step`` with auto.
    ``hosts``: per rank of the mesh, (host name, world rank, cores); ``threshold``: 0, None
    (the default), a number, or "off" (PYSHARD_TRANSPORT=mpi)."""
    if step.kind not in COLLECTIVES:
        return "local", ""
    item = step.src.dtype.itemsize
    size = prod(mesh.shape[m] for m in step.mesh_dims)
    every = list(itertools.product(*[range(n) for n in mesh.shape]))
    block, peers = geometry(step) if step.kind in ("alltoallv", "allgatherv") else (0, 0)
    if step.kind == "reduce_scatter":  # the largest piece a rank receives reduced
        nbytes = max(volume(step.dst.box(c)) for c in every) * item
    elif step.kind == "allreduce":  # the chunk of its block each rank reduces
        nbytes = max(volume(step.src.box(c)) for c in every) * item // size
    else:
        nbytes = block * item
    group = members(mesh, step.mesh_dims)
    k = ps.config.get("PYSHARD_NODE_SIZE") or 0
    nodes = [(hosts[r][0], hosts[r][1] // k if k else 0) for r in group]
    on_host = Counter(hosts[r][0] for r in group)
    cores = {h: min(hosts[r][2] for r in group if hosts[r][0] == h) for h in on_host}
    over = any(n > cores[h] for h, n in on_host.items())
    limit = (KIB256 if over else KIB16) if threshold is None else threshold
    if step.kind in REDUCTIONS:
        usable = len(set(nodes)) == 1
    else:
        usable = len(set(nodes)) < len(nodes)
    if step.kind == "alltoallv" and usable:
        usable = node_moves(step, mesh, group, nodes)
    if threshold != "off" and usable and nbytes >= limit:
        return "shm", ""
    if step.kind == "alltoallv":
        return "mpi", "p2p" if 4 * peers <= size else "alltoallv"
    return "mpi", ""


@pytest.mark.parametrize("threshold", [0, None, 1 << 40, "off"])
def test_explain_names_the_path_that_runs(comm, threshold):
    rng = random.Random(77 + comm.size)
    settings = {"PYSHARD_TRANSPORT": "mpi"} if threshold == "off" else {
        "PYSHARD_TRANSPORT": "auto", "PYSHARD_SHM_MIN_BYTES": threshold}  # fmt: skip
    hosts = comm.allgather((socket.gethostname(), MPI.COMM_WORLD.Get_rank(), os.cpu_count()))
    one_node = ps.config.get("PYSHARD_NODE_SIZE") is None and len({h[0] for h in hosts}) == 1
    bad, seen = [], Counter()
    with ps.config.override(**settings):
        for mshape in MESHES.get(comm.size, [(comm.size,)]):
            mesh = ps.Mesh(comm, mshape)
            cases = []
            for _ in range(8):
                ndim = rng.choice((1, 2, 3))
                shape = tuple(rng.randrange(1, 3 * comm.size + 5) for _ in range(ndim))
                cases.append((shape, [placement(rng, ndim, True) for _ in mshape],
                              [placement(rng, ndim, False) for _ in mshape]))  # fmt: skip
            # gathers whose every block is rows x cols float64: at and just under each
            # default threshold (16 KiB = 2 x 1024 x 8 B, 256 KiB = 32 x 1024 x 8 B)
            for rows, cols in (2, 1024), (2, 1023), (32, 1024), (32, 1023):
                cases.append(((rows * comm.size, cols), [Shard(0)] * len(mshape),
                              [Replicate()] * len(mshape)))  # fmt: skip
            for shape, src, dst in cases:
                g = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
                x = ps.distribute(g, mesh, src)
                p = x.plan_to(dst)
                want = [expected(s, mesh, hosts, threshold) for s in p.steps]
                case = f"{mshape} {shape} {src} -> {dst}"
                text = explain(p, mesh=mesh)
                said = [ln.split("on this mesh: ")[1].split(";")[0] for ln in text.splitlines()
                        if "on this mesh: " in ln]  # fmt: skip
                words = [path + (f" ({a})" if a else "") for path, a in want]
                if said != words:
                    bad.append(f"{case}: explain says {said}, the rule {words}")
                for s, (path, a) in zip(p.steps, want):
                    r = route(s, mesh, "auto")
                    if (r.path, r.algorithm if r.algorithm != r.path else "") != (path, a):
                        bad.append(f"{case}: {s.kind}: route {r.path} {r.algorithm}, the rule "
                                   f"{path} {a}")  # fmt: skip
                # what the core counts: one collective per collective step, named as above
                ran = Counter(
                    "shm" if path == "shm" else a or str(s.kind)
                    for s, (path, a) in zip(p.steps, want) if path != "local"
                )  # fmt: skip
                seen.update(path for path, _ in want)
                before = ps.comm_stats()
                y = x.redistribute(dst)
                got = counts_since(before)
                named = Counter()
                for k, v in got.items():
                    named[MPI_NAME.get(k, k)] += v
                if named != ran:
                    bad.append(f"{case}: ran {got}, the rule says {dict(ran)}")
                if threshold in ("off", 1 << 40) and "shm" in got:
                    bad.append(f"{case}: node-shared memory {threshold}: {got}")
                if threshold == 0 and one_node and comm.size > 1:
                    n = sum(s.kind in COLLECTIVES for s in p.steps)
                    if got != ({"shm": n} if n else {}):
                        bad.append(f"{case}: one node, threshold 0: ran {got}, {n} steps")
                for s, (path, _) in zip(p.steps, want):
                    w = describe(s)
                    if threshold != "off" and w is not None:
                        if path == "shm" and not w.startswith("node-shared memory"):
                            bad.append(f"{case}: {s.kind} takes shm, describe says {w}")
                        if w.startswith("MPI") and path == "shm":
                            bad.append(f"{case}: {s.kind}: describe says MPI, the rule shm")
                if not np.array_equal(y.local, g[y.box]):  # (distribute: Partial sums to g)
                    bad.append(f"{case}: wrong result")
            mesh.free()
    assert not bad, "\n".join(bad[:10])
    if comm.size > 1:  # the cases reach both sides of the rule
        assert seen["mpi"] or threshold == 0, seen
        assert seen["shm"] or threshold in ("off", 1 << 40) or not one_node, seen
