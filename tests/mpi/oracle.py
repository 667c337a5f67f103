"""Deterministic global arrays and per-rank partial contributions for the oracle tests, and
``check``/``agree`` for tests that check inside a loop of collective calls."""

from __future__ import annotations

from math import prod

import numpy as np

try:
    import ml_dtypes
except ImportError:  # the optional extra pyshard[ml]: its dtypes are left out
    ml_dtypes = None

# bfloat16 and one float8 format (ml_dtypes) where it is installed: CI installs it
ML_DTYPES = ["bfloat16", "float8_e4m3fn"] if ml_dtypes is not None else []
DTYPES = ["float16", "float32", "float64", "int32", "int64", "bool", "complex128", *ML_DTYPES]


def as_dtype(dtype):
    """numpy dtype of ``dtype`` (names such as "bfloat16" resolve once ml_dtypes is imported)."""
    return np.dtype(dtype)


def is_ml(dtype):
    """One of ml_dtypes' floats (bfloat16, float8_*)?"""
    return as_dtype(dtype).type.__module__.split(".")[0] == "ml_dtypes"


def is_floating(dtype):
    dt = as_dtype(dtype)
    return dt.kind == "f" or is_ml(dt)


def make_global(shape, dtype, seed=0):
    """A deterministic array of ``shape`` whose values are exact in every dtype (float8:
    rounded once to the format, as given)."""
    dtype = as_dtype(dtype)
    n = prod(shape)
    base = (np.arange(n, dtype=np.int64) * 7919 + 31 * seed) % 251
    if dtype.kind == "b":
        out = base % 3 == 0
    elif dtype.kind == "c":
        out = (base - 125) + 1j * ((base * 13) % 17)
    elif is_floating(dtype):
        out = (base - 125) / 4.0  # exact in float16 and bfloat16 (|x| <= 32, quarter steps)
    else:
        out = base - 125
    return np.asarray(out).astype(dtype).reshape(shape)


def make_global_box(shape, dtype, box, seed=0):
    """``make_global(shape, dtype, seed)[box]`` (``box``: one slice per dim, steps of 1),
    computed from the flat indices of the box alone: a rank checks its shard of a large
    array without building the whole of it."""
    dtype = as_dtype(dtype)
    strides = [prod(shape[d + 1:]) for d in range(len(shape))]
    idx = np.zeros([b.stop - b.start for b in box], dtype=np.int64)
    for d, b in enumerate(box):
        sh = [1] * len(shape)
        sh[d] = b.stop - b.start
        idx += (np.arange(b.start, b.stop, dtype=np.int64) * strides[d]).reshape(sh)
    base = (idx * 7919 + 31 * seed) % 251
    if dtype.kind == "b":
        out = base % 3 == 0
    elif dtype.kind == "c":
        out = (base - 125) + 1j * ((base * 13) % 17)
    elif is_floating(dtype):
        out = (base - 125) / 4.0
    else:
        out = base - 125
    return np.asarray(out).astype(dtype).reshape(idx.shape)


def reduce_once(stack, op, dtype):
    """pyshard's rule for bfloat16 and float8: accumulate in float32 (sum; avg divides the
    sum by n, as numpy's mean), round once to ``dtype``, to nearest even."""
    f = stack.astype(np.float32)
    if op == "sum":
        r = f.sum(axis=0)
    elif op == "avg":
        r = f.sum(axis=0) / np.float32(len(stack))
    elif op == "max":
        r = f.max(axis=0)
    else:
        r = f.min(axis=0)
    return r.astype(dtype)


def contributions(shape, dtype, nparts, op, seed=0):
    """``nparts`` partial arrays and their reduction by ``op`` (exact in every dtype; for
    bfloat16 and float8, the float32 sum rounded once)."""
    parts = [make_global(shape, dtype, seed=seed + 101 * (i + 1)) for i in range(nparts)]
    dtype = as_dtype(dtype)
    if dtype.kind == "f" and dtype.itemsize == 2:
        parts = [(p / 8).astype(dtype) for p in parts]  # keep sums exact in float16
    stack = np.stack(parts) if parts else np.zeros((0,) + tuple(shape), dtype)
    if is_ml(dtype):
        return parts, reduce_once(stack, op, dtype)
    if op == "sum":
        ref = np.logical_or.reduce(stack, axis=0) if dtype.kind == "b" else stack.sum(axis=0)
    elif op == "avg":
        ref = stack.sum(axis=0)
        if ref.dtype.kind == "c":  # each part divided by the count (numpy's complex / n
            # multiplies by 1 / (n + 0j): two roundings); pyshard divides so
            ref.real /= nparts
            ref.imag /= nparts
        else:
            ref = ref / nparts
    elif op == "max":
        ref = stack.max(axis=0)
    else:
        ref = stack.min(axis=0)
    return parts, np.asarray(ref).astype(dtype)


def reducible(ops, dtype):
    """Can every Partial op in ``ops`` reduce ``dtype``? (avg: floating or complex only;
    max and min: not complex)."""
    kind = as_dtype(dtype).kind
    if "avg" in ops and kind not in "fc" and not is_ml(dtype):
        return False
    return not (("max" in ops or "min" in ops) and kind == "c")


def halo_expected(g, lo, hi, width, periodic, corners, fill):
    """The padded block ``[lo, hi)`` of global ``g`` after a halo update, by the semantics:
    the interior holds the owned values; a ghost cell at global index ``lo - width + i``
    holds ``g`` there (wrapped on periodic dims) when it lies inside on every non-periodic
    dim and, for a star stencil (``corners=False``), outside the box on exactly one dim;
    every other cell keeps ``fill``."""
    idx, ghost, outside = halo_cells(g.shape, lo, hi, width, periodic, corners)
    shape = ghost.shape
    out = np.full(shape, fill, dtype=g.dtype)
    if not all(shape) or not g.size:
        return out
    vals = g[np.ix_(*[np.mod(i, g.shape[d]) for d, i in enumerate(idx)])]
    write = ghost | (outside == 0)
    out[write] = vals[write]
    return out


def halo_cells(gshape, lo, hi, width, periodic, corners):
    """The padded block of the box [lo, hi) of a global array of shape ``gshape``: its global
    (unwrapped) indices per dim, the mask of the ghost cells an update writes (inside on every
    non-periodic dim; with a star stencil, outside the box on exactly one dim), and how many
    dims each cell lies outside the box on (0: the interior)."""
    nd = len(gshape)
    idx = [np.arange(lo[d] - width[d], hi[d] + width[d]) for d in range(nd)]
    shape = tuple(len(i) for i in idx)
    valid = np.ones(shape, bool)
    outside = np.zeros(shape, np.int64)
    for d in range(nd):
        view = [1] * nd
        view[d] = shape[d]
        i = idx[d]
        ok = ((i >= 0) & (i < gshape[d])) | bool(periodic[d])
        valid &= ok.reshape(view)
        outside += ((i < lo[d]) | (i >= hi[d])).reshape(view)
    return idx, valid & ((outside >= 1) if corners else (outside == 1)), outside


EXCHANGE_NAMES = ("alltoallv", "p2p", "allgather", "allgatherv")
REDUCE_NAMES = ("reduce_scatter", "reduce_scatter_block", "allreduce")


_HOSTS = []


def world_hosts():
    """Every world rank's host, as an index into the job's host names in order of first
    appearance (one ``allgather`` of ``socket.gethostname()`` over ``COMM_WORLD`` on the first
    call: call it where every rank does, as the collective tests do). One host but for jobs
    across hosts (scripts/two-nodes.sh)."""
    if not _HOSTS:
        import socket

        from mpi4py import MPI

        names = MPI.COMM_WORLD.allgather(socket.gethostname())
        _HOSTS.append([list(dict.fromkeys(names)).index(n) for n in names])
    return _HOSTS[0]


def node_groups(mesh, dims):
    """The nodes of the ranks of ``mesh``'s communicator over ``dims``, from the environment
    alone (never from pyshard's node map): a node is a host (world_hosts: one machine but for
    jobs across hosts, scripts/two-nodes.sh), split into nodes of ``PYSHARD_NODE_SIZE``
    consecutive world ranks when it is set; a mesh over ``COMM_WORLD`` keeps the world ranks.
    None where node-shared memory is off (``PYSHARD_TRANSPORT`` mpi, direct or staged, from
    the environment or set from Python as tests/mpi/test_staged.py's fixture does)."""
    import os

    import numpy as np
    from mpi4py import MPI

    from pyshard import config

    if config.get("PYSHARD_TRANSPORT") not in ("auto", "shm"):  # the setting, as given
        return None
    k = int(os.environ.get("PYSHARD_NODE_SIZE", "").strip() or 0)
    world = MPI.COMM_WORLD.Get_rank() - mesh.rank  # the mesh's rank 0 in the world
    members = [int(np.ravel_multi_index(c, mesh.shape)) for c in member_coords(mesh, dims)]
    hosts = world_hosts()
    return [(hosts[world + r], (world + r) // k if k else 0) for r in members]


def member_coords(mesh, dims):
    """The mesh coords of the ranks of ``mesh``'s communicator over ``dims`` (row-major: the
    communicator's rank order)."""
    import itertools

    ranges = [
        range(n) if d in dims else (c,) for d, (n, c) in enumerate(zip(mesh.shape, mesh.coords))
    ]
    return list(itertools.product(*ranges))


def node_blocks(mesh, step, receiver=None):
    """Does some block of exchange ``step`` go between two different ranks of one node of its
    communicator (node_groups)? By every (sender, receiver) pair of the communicator and their
    boxes in the step's layouts: a receiver takes each block from the rank that holds it and
    shares its coords on the mesh dims the source does not shard (its own replica). False
    where node-shared memory is off. ``receiver``: mesh coords; only blocks to that rank."""
    from pyshard import Shard

    groups = node_groups(mesh, step.mesh_dims)
    if groups is None:
        return False
    src, dst = step.src, step.dst
    sharding = {m for m, p in enumerate(src.placements) if isinstance(p, Shard)}
    fixed = [m for m in step.mesh_dims if m not in sharding]
    coords = member_coords(mesh, step.mesh_dims)
    for i, s in enumerate(coords):
        for j, r in enumerate(coords):
            if i == j or groups[i] != groups[j] or any(s[m] != r[m] for m in fixed):
                continue
            if receiver is not None and any(r[m] != receiver[m] for m in step.mesh_dims):
                continue
            a, b = src.box(s), dst.box(r)
            if all(min(x.stop, y.stop) > max(x.start, y.start) for x, y in zip(a, b)):
                return True
    return False


def shares_node(mesh, dims):
    """Do two ranks of the communicator over ``dims`` share a node (see node_groups)?"""
    groups = node_groups(mesh, dims)
    return groups is not None and len(set(groups)) < len(groups)


def auto_exchange(mesh, counts, algorithm="auto", dims=None, step=None):
    """``counts`` (collectives by name) as ``comm_stats()`` counts them when the steps of an
    ``auto`` call on ``mesh`` dims ``dims`` (default all) take node-shared memory (for small
    arrays only with PYSHARD_SHM_MIN_BYTES=0, as CI stages run the suite)
    (pyshard/_shm.py): "shm" in place of "alltoallv" / "p2p" / "allgather(v)", and of
    "reduce_scatter(_block)" and "allreduce" where every rank of the communicator shares one
    node. ``step``: the exchange step of a redistribute, which takes node-shared memory only
    where some block of it goes between two ranks of one node (node_blocks); None for a batch
    of redistribute_many, which goes by its communicator alone.
    Which communicators share a node comes from the environment (node_groups)."""
    import pyshard as ps

    names = EXCHANGE_NAMES + REDUCE_NAMES
    if algorithm != "auto" or not any(k in counts for k in names):
        return counts
    # auto keeps small blocks on MPI: these tests' arrays are small
    if ps.config.get("PYSHARD_SHM_MIN_BYTES") != 0:
        return counts
    dims = tuple(range(mesh.ndim)) if dims is None else tuple(dims)
    if not shares_node(mesh, dims):
        return counts
    if len(set(node_groups(mesh, dims))) != 1:  # reductions take MPI where ranks span nodes
        names = EXCHANGE_NAMES
    if step is not None and step.kind == "alltoallv" and not node_blocks(mesh, step):
        names = tuple(k for k in names if k not in ("alltoallv", "p2p"))
    out = {k: v for k, v in counts.items() if k not in names}
    moved = sum(v for k, v in counts.items() if k in names)
    if moved:
        out["shm"] = moved
    return out



def _mesh_coord(layout, d, i, m):
    """The coordinate along mesh dim ``m`` of the shard of ``layout`` that holds element ``i``
    of array dim ``d`` (``m`` shards ``d``; nested shards row-major over their mesh dims)."""
    mdims, ext, off = layout.table[d]
    k = next(k for k, (o, e) in enumerate(zip(off, ext)) if o <= i < o + e)
    return int(np.unravel_index(k, [layout.mesh_shape[x] for x in mdims])[mdims.index(m)])


def exchanges(a, b):
    """Does going from layout ``a`` to ``b`` (no Partial in either) cross ranks, by
    docs/site/planning.md's N-D rule ("one exchange over the sub-communicator of the mesh
    dims where data actually crosses ranks"): a mesh dim of more than one rank that shards
    array dim ``d`` in ``a`` crosses unless ``b`` shards ``d`` on it too with every element of
    ``d`` at the same coordinate along it. Read per mesh dim and element index, not per box:
    a shard that moves is an exchange even where it, or the whole array, is empty (the
    collective then carries no bytes). Replicated source dims never cross: each rank reads
    what it needs from the replica at its own coordinates."""
    from pyshard import Shard

    for m, p in enumerate(a.placements):
        if not isinstance(p, Shard) or a.mesh_shape[m] == 1:
            continue
        if b.placements[m] != p:
            return True
        d = p.dim
        if any(_mesh_coord(a, d, i, m) != _mesh_coord(b, d, i, m) for i in range(a.shape[d])):
            return True
    return False


def collectives_by_rule(src, dst):
    """The collectives one redistribution from layout ``src`` to ``dst`` runs, from the
    layouts alone by docs/site/planning.md's rules (its 1-D cost table and "N-D meshes"):

    1. each Partial mesh dim of ``src`` that ``dst`` does not keep as the same Partial is
       reduced (one rank: nothing to reduce): by one Reduce_scatter where ``dst`` shards it,
       onto ``dst``'s array dim when no mesh dim shards that yet, else onto the largest array
       dim none shards (with ``dst``'s extents where ``dst`` shards that dim by this mesh dim
       alone: "Partial -> Shard, one Reduce_scatter with the uneven counts"); where ``dst``
       does not shard it, or no array dim is free, by one Allreduce for all such dims of one
       op;
    2. ``dst``'s new Partial dims read as Replicate, except that a mesh dim that shards an
       array dim alone, which ``dst`` does not shard, stays sharded when every new Partial
       has one op among sum, max and min ("Shard(d) -> Partial on the same mesh dim needs no
       communication");
    3. then one exchange (an Alltoallv or an Allgatherv) where the reduced layout and that
       target differ and some shard crosses ranks (:func:`exchanges`); making the Partial
       dims is local."""
    import pyshard as ps
    from pyshard import Partial, Replicate, Shard

    if src == dst:
        return 0
    pls, sizes = list(src.placements), dict(src.sizes)
    n, ops = 0, set()
    for m, p in enumerate(src.placements):
        if not isinstance(p, Partial) or dst.placements[m] == p:
            continue
        pls[m], t = Replicate(), dst.placements[m]
        if src.mesh_shape[m] == 1:
            continue
        free = [d for d in range(src.ndim) if Shard(d) not in pls]
        if isinstance(t, Shard) and free:
            d = t.dim if t.dim in free else max(free, key=lambda d: (src.shape[d], -d))
            pls[m] = Shard(d)
            if dst.table[d][0] == (m,):
                sizes[d] = dst.table[d][1]
            n += 1
        else:
            ops.add(p.op)
    reduced = ps.Layout(src.shape, src.dtype, src.mesh_shape, pls, sizes)
    new = [m for m, p in enumerate(dst.placements) if isinstance(p, Partial) and pls[m] != p]
    one_op = {dst.placements[m].op for m in new}
    spread = len(one_op) == 1 and one_op <= {"sum", "max", "min"}
    eff, eff_sizes = list(dst.placements), dict(dst.sizes)
    for m in new:
        q = pls[m]
        if spread and isinstance(q, Shard) and reduced.table[q.dim][0] == (m,) \
                and not dst.table[q.dim][0]:  # fmt: skip
            eff[m], eff_sizes[q.dim] = q, reduced.table[q.dim][1]
        else:
            eff[m] = Replicate()
    target = ps.Layout(dst.shape, dst.dtype, dst.mesh_shape, eff, eff_sizes)
    return n + len(ops) + int(reduced != target and exchanges(reduced, target))


def check(failures, where, fn, *args):
    """Run the check ``fn(*args)``; a failure is noted, not raised, so that this rank goes on
    to the same collectives as the others (a rank that left a loop of collectives alone
    would leave the rest waiting for it); ``agree`` fails the test on every rank."""
    try:
        fn(*args)
    except AssertionError as e:
        failures.append(f"{where}: {e}")


def agree(comm, failures):
    """Fail on every rank where some rank noted a failure, naming the ranks (collective over
    ``comm``, an mpi4py communicator)."""
    bad = comm.allgather(failures)
    assert not any(bad), [f"rank {r}: {f}" for r, fs in enumerate(bad) for f in fs][:8]
