"""pyshard.fft's passes on padded storage (docs/fft.md, "Padded storage for leading axes"): a
c2c pass along a leading axis whose byte stride is a multiple of 4 KiB runs on a storage one
element longer along the next dim, which the transpose before it writes (and the one after it
reads) directly, on node-shared memory and on MPI alike. Every case here is one where the
plan pads: the results must equal numpy.fft's on the global array, come back C-contiguous,
land in ``out=``, and invert; uneven and empty shards on 1-D and 2-D meshes, complex64 and
complex128, norms, forward and backward plans.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracle import make_global

import pyshard as ps
from pyshard import Shard
from pyshard import fft as pf
from pyshard.fft.fftplan import padded_passes
from pyshard.geometry import ALIAS_BYTES, alias_pad, padded

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]

TOL = {np.dtype(np.complex64): 2e-5, np.dtype(np.complex128): 1e-12,
       np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def cases(size, dtypes=(np.complex128, np.complex64)):
    """(mesh shape, input placements, sizes, global shape, dtype) whose plans pad at
    ``size`` ranks: the pass along axis 0 after a transpose sees planes of 4 KiB (16 x 16
    complex128, 32 x 16 complex64 or float64, 64 x 16 float32) or rows of 4 KiB."""
    dims = tuple(MPI.Compute_dims(size, 2))
    out = []
    for dt in dtypes:
        row = 256 // np.dtype(dt).itemsize
        n = 16 * size
        out.append(((size,), [Shard(0)], None, (6, row, n), dt))  # balanced 1-D
        if size > 1:  # 16 x 16 planes on all ranks but the last (15): it does not pad
            out.append(((size,), [Shard(0)], None, (6, row, n - 1), dt))
        if size > 1:  # uneven, the last shard empty (axis 0 longer past 7 ranks)
            lead = max(6, size)
            sz = {0: [lead - (size - 2)] + [1] * (size - 2) + [0]}
            out.append(((size,), [Shard(0)], sz, (lead, row, n), dt))
        out.append((dims, [Shard(0), Shard(1)], None, (5, row * dims[0], 16 * dims[1]), dt))
        # 2-D: back to [Shard(0)], the pass along axis 0 sits between two transposes, on rows
        # one 64-byte line longer
        out.append(((size,), [Shard(0)], None, (7, (4096 // np.dtype(dt).itemsize) * size), dt))
    return out


def agree(comm, ok, where):
    bad = comm.allreduce(0 if ok else 1, op=MPI.SUM)
    assert bad == 0, f"{where}: wrong on {bad} rank(s)"


def test_alias_pad_rule():
    # a 4 KiB stride along a leading axis pads the next dim; other strides, or only the last
    # axis transformed, do not
    # (a 64-byte line where the padded dim is the last)
    assert alias_pad((8, 16, 16), 16, (0,)) == (1, 1)
    assert alias_pad((8, 16, 16), 16, (2,)) is None
    assert alias_pad((8, 16, 15), 16, (0,)) is None
    assert alias_pad((8, 16, 256), 16, (0, 1)) == (2, 4)  # the innermost aliasing axis: 1
    assert alias_pad((8, 256, 16), 16, (0, 1)) == (1, 1)  # axis 1 steps by 256 B
    assert alias_pad((4, 32, 16), 8, (0,)) == (1, 1)
    assert alias_pad((64, 512), 8, (0,)) == (1, 8)
    assert ALIAS_BYTES == 4096
    assert padded((4, 5, 6), (1, 1)) == [4, 6, 6] and padded((4, 5, 6), None) == [4, 5, 6]
    assert padded((4, 5, 6), (2, 4)) == [4, 5, 10]


@pytest.mark.parametrize("norm", [None, "ortho"])
def test_padded_passes_match_numpy(comm, norm):
    used = lines = mixed = 0
    for ms, pl, sizes, shape, dt in cases(comm.size):
        mesh = ps.Mesh(comm, ms)
        g = make_global(shape, dt)
        x = ps.distribute(g, mesh, pl, sizes=sizes)
        ref = np.fft.fftn(g.astype(np.complex128), norm=norm)
        scale = float(np.max(np.abs(ref)))
        tol = TOL[np.dtype(dt)] * scale * 10
        where = f"{ms} {pl} {sizes} {shape} {np.dtype(dt).name} norm={norm}"
        for target in ("any", pl):
            p = pf.plan(x.layout, "fftn", norm=norm, placements=target)
            pads = padded_passes(p.passes)
            back = padded_passes(p.backward_passes)
            rules = [r for r in pads + back if r is not None]
            used += len(rules)
            lines += sum(r.last for r in rules)
            every = [tuple(int(c) for c in np.unravel_index(k, ms)) for k in range(comm.size)]
            mixed += sum(len({r.of(c) is None for c in every}) == 2 for r in rules)
            y = pf.fftn(x, norm=norm, placements=target)
            got = y.local
            ok = got.flags.c_contiguous and got.dtype == np.dtype(dt)
            ok = ok and (not got.size or float(np.max(np.abs(got - ref[y.box]))) <= tol)
            agree(comm, ok, f"fftn {where} -> {target}")
            # out= of the plan: the padded last pass copies its result there
            o = np.full(got.shape, np.nan, got.dtype)
            r = p.forward(x, out=o)
            ok = r.local is o and (not o.size or float(np.max(np.abs(o - ref[y.box]))) <= tol)
            agree(comm, ok, f"fftn out= {where} -> {target}")
            # the backward plan: its first pass is the padded one when the forward's last was
            z = p.backward(y)
            ok = z.local.flags.c_contiguous and z.layout == x.layout
            err = float(np.max(np.abs(z.local - g[z.box]))) if z.local.size else 0.0
            agree(comm, ok and err <= TOL[np.dtype(dt)] * max(float(np.max(np.abs(g))), 1) * 10,
                  f"backward {where} -> {target}: error {err}")
            # ifftn of the transform through the function API (its own plan)
            w = pf.ifftn(y, norm=norm, placements=pl, sizes=sizes)
            err = float(np.max(np.abs(w.local - g[w.box]))) if w.local.size else 0.0
            agree(comm, err <= TOL[np.dtype(dt)] * max(float(np.max(np.abs(g))), 1) * 10,
                  f"ifftn {where}: error {err}")
            # the input is left as it was
            agree(comm, not x.local.size or np.array_equal(x.local, g[x.box].astype(dt)),
                  f"input changed {where}")
    if comm.size > 1:
        assert used > 0, "no case took the padded path: the test checks nothing new"
        assert lines > 0, "no case padded a last dim"
        assert mixed > 0, "no case padded some ranks and not others"


@pytest.mark.parametrize("kind", ["dctn", "idstn"])
def test_padded_r2r_match_scipy(comm, kind):
    sf = pytest.importorskip("scipy.fft")
    used = 0
    for ms, pl, sizes, shape, dt in cases(comm.size, (np.float64, np.float32)):
        mesh = ps.Mesh(comm, ms)
        g = make_global(shape, dt)
        x = ps.distribute(g, mesh, pl, sizes=sizes)
        for type_, norm, orth in ((2, None, None), (1, "ortho", None), (3, "ortho", False),
                                  (4, "forward", None)):
            ref = getattr(sf, kind)(g.astype(np.float64), type=type_, norm=norm,
                                    orthogonalize=orth)
            tol = TOL[np.dtype(dt)] * max(float(np.max(np.abs(ref))), 1) * 10
            where = f"{kind} type {type_} norm={norm} {ms} {pl} {sizes} {shape} {np.dtype(dt)}"
            for target in ("any", pl):
                p = pf.plan(x.layout, kind, type=type_, norm=norm, placements=target,
                            orthogonalize=orth)
                used += sum(d is not None for d in padded_passes(p.passes))
                y = p.forward(x)
                ok = y.local.flags.c_contiguous and y.local.dtype == np.dtype(dt)
                err = float(np.max(np.abs(y.local - ref[y.box]))) if y.local.size else 0.0
                agree(comm, ok and err <= tol, f"{where} -> {target}: error {err}")
                z = p.backward(y)
                err = float(np.max(np.abs(z.local - g[z.box]))) if z.local.size else 0.0
                agree(comm, err <= TOL[np.dtype(dt)] * 32 * 10, f"back {where}: error {err}")
    if comm.size > 1:
        assert used > 0, "no case took the padded path"


def test_padded_plan_explains_the_same_collectives(comm):
    # padding changes the storage only: the transposes' collectives stay one per transpose
    ms, pl, sizes, shape, dt = cases(comm.size)[0]
    mesh = ps.Mesh(comm, ms)
    x = ps.distribute(make_global(shape, dt), mesh, pl, sizes=sizes)
    p = pf.plan(x.layout, "fftn", placements="any")
    pf.fftn(x, placements="any")  # built (and, under PYSHARD_ALGORITHM=tune, measured) once
    before = ps.comm_stats()
    pf.fftn(x, placements="any")
    now = ps.comm_stats()
    moved = sum(v - before.get(k, 0) for k, v in now.items()
                if k not in ("staged", "device_direct"))
    assert moved == p.collectives
