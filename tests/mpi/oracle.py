"""Deterministic global arrays and per-rank partial contributions for the oracle tests."""

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
    """pyshard's rule for bfloat16 and float8: accumulate in float32 (sum; avg scales the
    sum by float32(1/n)), round once to ``dtype``, to nearest even."""
    f = stack.astype(np.float32)
    if op == "sum":
        r = f.sum(axis=0)
    elif op == "avg":
        r = f.sum(axis=0) * np.float32(1.0 / len(stack))
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
        ref = stack.sum(axis=0) / nparts
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


def node_groups(mesh, dims):
    """The (simulated) nodes of the ranks of ``mesh``'s communicator over ``dims``, from the
    environment alone (never from pyshard's node map): every rank of these jobs runs on this
    one machine, split into nodes of ``PYSHARD_NODE_SIZE`` consecutive world ranks when it is
    set; a mesh over ``COMM_WORLD`` keeps the world ranks. None where node-shared memory is
    off (``PYSHARD_TRANSPORT`` mpi, direct or staged, from the environment or set from Python
    as tests/mpi/test_staged.py's fixture does)."""
    import itertools
    import os

    import numpy as np
    from mpi4py import MPI

    from pyshard import config

    if config.get("PYSHARD_TRANSPORT") not in ("auto", "shm"):  # the setting, as given
        return None
    k = int(os.environ.get("PYSHARD_NODE_SIZE", "").strip() or 0)
    world = MPI.COMM_WORLD.Get_rank() - mesh.rank  # the mesh's rank 0 in the world
    ranges = [range(n) if d in dims else (c,) for d, (n, c) in enumerate(zip(mesh.shape,
                                                                            mesh.coords))]
    members = [int(np.ravel_multi_index(c, mesh.shape)) for c in itertools.product(*ranges)]
    return [(world + r) // k if k else 0 for r in members]


def shares_node(mesh, dims):
    """Do two ranks of the communicator over ``dims`` share a node (see node_groups)?"""
    groups = node_groups(mesh, dims)
    return groups is not None and len(set(groups)) < len(groups)


def auto_exchange(mesh, counts, algorithm="auto", dims=None):
    """``counts`` (collectives by name) as ``comm_stats()`` counts them when the steps of an
    ``auto`` call on ``mesh`` dims ``dims`` (default all) take node-shared memory (for small
    arrays only with PYSHARD_SHM_MIN_BYTES=0, as CI stages run the suite)
    (pyshard/_shm.py): "shm" in place of "alltoallv" / "p2p" / "allgather(v)", and of
    "reduce_scatter(_block)" and "allreduce" where every rank of the communicator shares one
    node.
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
    out = {k: v for k, v in counts.items() if k not in names}
    moved = sum(v for k, v in counts.items() if k in names)
    if moved:
        out["shm"] = moved
    return out

