"""Bad input raises a clear ValueError/TypeError on every rank, before any communication."""

from __future__ import annotations

import re

import numpy as np
import pytest
from oracle import make_global

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard import fft as pf

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)


@pytest.fixture
def mesh(comm):
    return ps.Mesh(comm, (comm.size,))


def no_comm(fn, exc, match):
    before = ps.comm_stats()
    with pytest.raises(exc, match=match):
        fn()
    assert ps.comm_stats() == before, "an invalid call must fail before communicating"


def test_mesh_errors(comm):
    with pytest.raises(ValueError, match="communicator size"):
        ps.Mesh(comm, (comm.size + 1,))
    with pytest.raises(TypeError, match="intracommunicator"):
        ps.Mesh("COMM_WORLD", (1,))
    with pytest.raises(TypeError, match="intracommunicator"):
        ps.Mesh(None, (comm.size,))
    from mpi4py import MPI
    freed = comm.Dup()
    freed.Free()  # (mpi4py makes it MPI.COMM_NULL)
    # (a rank outside a Split, a freed communicator)
    for null in (MPI.COMM_NULL, comm.Split(MPI.UNDEFINED, 0), freed):
        with pytest.raises(ValueError, match=r"MPI.COMM_NULL: a freed one .*not in it"):
            ps.Mesh(null, (1,))
    with pytest.raises(ValueError, match="int >= 1"):
        ps.Mesh(comm, (comm.size, 0))
    with pytest.raises(ValueError, match="names"):
        ps.Mesh(comm, (comm.size,), names=("a", "b"))
    m = ps.Mesh(comm, (1, comm.size), names=("dp", "tp"))
    assert m.coords == (0, comm.rank) and m.ndim == 2 and m.size == comm.size
    assert m.sub("tp").Get_size() == comm.size and m.sub(0).Get_size() == 1
    with pytest.raises(ValueError, match="no dim named"):
        m.sub("pp")


def test_distribute_errors(mesh):
    g = make_global((6, 4), "float32")
    no_comm(lambda: ps.distribute(g, mesh, [Shard(0), Shard(1)]), ValueError, "placements has 2")
    no_comm(lambda: ps.distribute(g, mesh, [Shard(2)]), ValueError, "out of range")
    no_comm(lambda: ps.distribute(g, mesh, Shard(0)), TypeError, "placements must be a list")
    no_comm(lambda: ps.distribute(g, mesh, ["S0"]), TypeError, r"placements\[0\]")
    no_comm(lambda: ps.distribute(g.tolist(), mesh, [Shard(0)]), TypeError, "numpy array")
    no_comm(
        lambda: ps.distribute(np.empty((2, 2), dtype=object), mesh, [Shard(0)]),
        TypeError,
        "dtype",
    )
    no_comm(lambda: ps.distribute(g, "mesh", [Shard(0)]), TypeError, "pyshard.Mesh")
    p = mesh.size
    bad_sum = [7] + [0] * (p - 1)
    no_comm(lambda: ps.distribute(g, mesh, [Shard(0)], sizes={0: bad_sum}), ValueError, "sums to")
    neg = [7, -1] + [0] * (p - 2) if p > 1 else [-6]
    no_comm(lambda: ps.distribute(g, mesh, [Shard(0)], sizes={0: neg}), ValueError, "negative|sums")
    no_comm(
        lambda: ps.distribute(g, mesh, [Shard(0)], sizes={0: [6.0] + [0] * (p - 1)}),
        TypeError,
        "int",
    )
    no_comm(
        lambda: ps.distribute(g, mesh, [Shard(0)], sizes={0: [6] * (p + 1)}),
        ValueError,
        "extents but array dim 0 has",
    )
    no_comm(
        lambda: ps.distribute(g, mesh, [Shard(0)], sizes={1: [4] + [0] * (p - 1)}),
        ValueError,
        "not sharded",
    )
    with pytest.raises(ValueError, match="op must be one of"):
        Partial("prod")


def test_redistribute_errors(mesh):
    x = ps.distribute(make_global((6, 4), "float32"), mesh, [Shard(0)])
    no_comm(lambda: x.redistribute([Shard(5)]), ValueError, "out of range")
    no_comm(lambda: x.redistribute([Replicate(), Replicate()]), ValueError, "placements has 2")
    no_comm(lambda: x.redistribute([Shard(1)], sizes={1: [1] * 99}), ValueError, "extents")
    no_comm(lambda: x.redistribute([1]), TypeError, r"placements\[0\]")
    c = ps.distribute(np.ones((3,), np.complex64), mesh, [Replicate()])
    no_comm(lambda: c.redistribute([Partial("min")]), ValueError, "complex")
    # sizes= refused as distribute refuses them, not coerced (a float, a string, a bool, a
    # dim given twice); the first call and the cached one alike
    n = mesh.size
    for bad, exc, match in [
            ({1: [4 / n] * n}, TypeError, "must be an int"),
            ({1: "4" if n == 1 else "2" * n}, TypeError, "sequence of ints|must be an int"),
            ({1.0: [4] + [0] * (n - 1)}, TypeError, "must be an int"),
            ({1: [True] + [0] * (n - 1)}, TypeError, "must be an int"),
            ({1: [4] + [0] * (n - 1), -1: [0] * (n - 1) + [4]}, ValueError, "given twice")]:
        for _ in range(2):
            no_comm(lambda bad=bad: x.redistribute([Shard(1)], sizes=bad), exc, match)
        with pytest.raises(exc, match=match):
            ps.distribute(make_global((6, 4), "float32"), mesh, [Shard(1)], sizes=bad)
    # a local replaced by one of another dtype (the same itemsize, or narrower: read past its
    # end), on the first call and on the fast path of a repeated one
    for t in ([Shard(1)], [Replicate()]):
        y = ps.distribute(make_global((6, 4), "int64"), mesh, [Shard(0)])
        y.redistribute(t)
        for dt in ("float64", "int32"):
            y.local = y.local.astype(dt)
            no_comm(lambda y=y, t=t: y.redistribute(t), TypeError, "dtype")


def test_from_local_errors(comm, mesh):
    p, r = comm.size, comm.rank
    local = np.zeros((2, 3), np.float64)
    # the layout puts (2, 3) on every rank when the global shape is (2p, 3)
    ok = ps.from_local(local, mesh, [Shard(0)], global_shape=(2 * p, 3))
    assert ok.box == (slice(2 * r, 2 * r + 2), slice(0, 3))
    # (2p + 1, 3) puts 3 rows on rank 0 and 2 elsewhere: only rank 0's shard disagrees, and
    # only rank 0 raises (no communication, so the others are not left waiting)
    if p > 1:
        if r == 0:
            no_comm(
                lambda: ps.from_local(local, mesh, [Shard(0)], global_shape=(2 * p + 1, 3)),
                ValueError,
                "disagrees with the layout",
            )
        else:
            ps.from_local(local, mesh, [Shard(0)], global_shape=(2 * p + 1, 3))
    no_comm(lambda: ps.from_local([1, 2], mesh, [Shard(0)], global_shape=(2,)), TypeError, "numpy")
    # one rank passes a wrong shape: with validate=True every rank raises the same error
    bad = np.zeros((3 if r == p - 1 else 2, 3))
    with pytest.raises(ValueError, match=f"rank {p - 1} at mesh coords"):
        ps.from_local(bad, mesh, [Shard(0)], global_shape=(2 * p, 3), validate=True)
    # without a global shape the extents are gathered; inconsistent ones fail everywhere
    bad2 = np.zeros((2, 3 + (r == p - 1)))
    if p > 1:
        with pytest.raises(ValueError, match="disagree between ranks"):
            ps.from_local(bad2, mesh, [Shard(0)])
        # rank 0 the odd one out: every rank of the group by its extent (it named rank 1,
        # which agreed with the others)
        odd = np.zeros((2, 4 if r == 0 else 3))
        with pytest.raises(ValueError, match="disagree between ranks") as e:
            ps.from_local(odd, mesh, [Shard(0)])
        others = ("rank 1: 3" if p == 2 else f"ranks {', '.join(map(str, range(1, p)))}: 3")
        assert f"(rank 0: 4; {others})" in str(e.value), e.value
    bad3 = np.zeros((2, 3) if r != p - 1 else (2, 3, 1))
    if p > 1:
        with pytest.raises(ValueError, match="disagree in ndim"):
            ps.from_local(bad3, mesh, [Shard(0)])
    bad4 = np.zeros((2, 3), np.float32 if r == 0 else np.float64)
    if p > 1:
        with pytest.raises(ValueError, match="disagree in dtype"):
            ps.from_local(bad4, mesh, [Shard(0)])


def _same_error_everywhere(comm, exc, fn, *needles):
    """fn() raises exc on this rank with the same text as on every other rank."""
    with pytest.raises(exc) as e:
        fn()
    msg = str(e.value)
    assert comm.allgather(msg) == [msg] * comm.size, msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.mark.parametrize("case", ["ndim", "list", "object", "ndim>32"])
@pytest.mark.parametrize("how", ["validate", "infer"])
def test_from_local_one_bad_rank_raises_everywhere(comm, mesh, case, how):
    """One rank's local array is refused (the placements do not fit its ndim, a list, an
    object dtype): where from_local communicates, that rank must not raise alone before the
    Allgather (the others would wait in it); every rank raises the same error naming it."""
    p, r = comm.size, comm.rank
    good = np.zeros((2, 2))
    bad = {"ndim": np.zeros(2), "list": [[0.0, 0.0], [0.0, 0.0]],
           "object": np.zeros((2, 2), object), "ndim>32": np.zeros((1,) * 33)}[case]
    local = bad if r == p - 1 else good
    kw = {"global_shape": (2, 2 * p), "validate": True} if how == "validate" else {}
    exc = TypeError if case in ("list", "object") else ValueError
    what = {"ndim": "out of range for an array of ndim 1", "list": "got list",
            "object": "dtype object", "ndim>32": "ndim > 32"}[case]
    _same_error_everywhere(comm, exc, lambda: ps.from_local(local, mesh, [Shard(1)], **kw),
                           f"rank {p - 1}:", what)
    # and the mesh is still in step: a good call works
    x = ps.from_local(good, mesh, [Shard(1)], **kw)
    assert x.global_shape == (2, 2 * p)


def test_mesh_out_of_communicators_names_free(comm, monkeypatch):
    """MPI out of communicators (MPICH holds 2048; dropped meshes keep theirs): the error
    says to free meshes no longer needed."""
    def boom(self, dims):
        raise RuntimeError("pyshard: MPI_Comm_dup failed: Too many communicators")

    monkeypatch.setattr(ps.Mesh, "core_comm", boom)
    with pytest.raises(RuntimeError, match="Too many communicators.*Mesh.free"):
        ps.Mesh(comm, (comm.size,))


class _Sub(np.ndarray):
    """An ndarray subclass, as numpy.memmap and numpy.matrix are."""


def test_subclass_locals_held_as_plain_arrays(comm, mesh, tmp_path_factory):
    """A numpy.memmap (or numpy.matrix, another) subclass handed in as a local or global array is
    held as a plain ndarray view of the same memory: a plain out= of the result's shape then
    fits (it raised "out must be a plain memmap, got ndarray"). A masked array is refused on
    every rank (its mask would be dropped without a word)."""
    p, r = comm.size, comm.rank
    g = make_global((2 * p, 3), np.float64, seed=3)
    mine = g[2 * r:2 * r + 2]
    path = tmp_path_factory.mktemp(f"mm{r}") / "a.dat"
    mm = np.memmap(path, np.float64, "w+", shape=mine.shape)
    mm[...] = mine
    for local in (mm, mine.copy().view(_Sub)):
        x = ps.from_local(local, mesh, [Shard(0)])
        assert type(x.local) is np.ndarray and np.shares_memory(x.local, local)
        out = np.empty((2 * p, 3))
        y = x.redistribute([Replicate()], out=out)
        assert y.local is out and np.array_equal(out, g)
        z = ps.ShardedArray(local, x.layout, mesh)
        assert type(z.local) is np.ndarray
    x = ps.distribute(g.view(_Sub), mesh, [Shard(0)])
    assert type(x.local) is np.ndarray and np.array_equal(x.local, mine)
    masked = np.ma.masked_array(mine, mask=np.zeros(mine.shape, bool))
    local = masked if r == p - 1 else mine
    _same_error_everywhere(comm, TypeError, lambda: ps.from_local(local, mesh, [Shard(0)]),
                           f"rank {p - 1}:", "masked array")
    with pytest.raises(TypeError, match="masked array"):
        ps.distribute(np.ma.masked_array(g), mesh, [Shard(0)])


@pytest.mark.parametrize("dt", [">f8", ">i4", ">c16", "<f8"])
def test_distribute_a_0d_array_keeps_its_byte_order(mesh, dt):
    """A 0-d array in non-native byte order distributes as itself (a[()] is a numpy scalar,
    always native: it raised "local array () float64 disagrees with the layout ... >f8")."""
    a = np.array(2.25 if dt[1] != "i" else 7, dt)
    x = ps.distribute(a, mesh, [Replicate()] * mesh.ndim)
    assert x.local.dtype == np.dtype(dt) and x.local.shape == () and x.local == a


@pytest.mark.mpi(min_size=2)
def test_from_local_disagreement_names_what_differs(comm, mesh):
    p, r = comm.size, comm.rank
    dt = np.float32 if r == p - 1 else np.float64
    for kw in ({}, {"global_shape": (2 * p, 3), "validate": True}):
        msg = _same_error_everywhere(
            comm, ValueError, lambda kw=kw: ps.from_local(np.zeros((2, 3), dt), mesh, [Shard(0)],
                                                          **kw),
            "disagree in dtype", "float32", "float64", f"rank {p - 1}: float32")
        assert "ndim" not in msg.split("(")[0], msg
    local = np.zeros((2, 3) if r != p - 1 else (2, 3, 1))
    _same_error_everywhere(comm, ValueError, lambda: ps.from_local(local, mesh, [Shard(0)]),
                           "disagree in ndim", f"rank {p - 1}: 3")


def test_from_local_sizes_without_global_shape_before_communicating(mesh):
    no_comm(lambda: ps.from_local(np.zeros((2, 3)), mesh, [Shard(0)], sizes={0: [2] * mesh.size}),
            ValueError, "sizes only together with global_shape")


def test_replaced_local_of_another_shape(comm, mesh):
    """.local replaced by an array of its dtype but another shape: refused on the first call
    and on the fast path, for plans with an exchange, a local copy or no step at all."""
    g = make_global((8, 4), "float64")
    for src, tgt in [([Replicate()], [Shard(0)]), ([Shard(0)], [Shard(1)]),
                     ([Shard(0)], [Shard(0)]), ([Replicate()], [Replicate()])]:
        for warm in (False, True):
            x = ps.distribute(g, mesh, src)
            if warm:
                for _ in range(3):
                    x.redistribute(tgt)
            x.local = np.zeros((1, 1))
            for _ in range(2):
                with pytest.raises(ValueError, match=r"local array has shape \(1, 1\)"):
                    x.redistribute(tgt)
            with pytest.raises(ValueError, match="layout puts"):
                x.redistribute(tgt, wait=False)
            want = x.layout.local_shape(mesh.coords)
            with pytest.raises(ValueError, match=re.escape(f"the layout puts {want}")):
                x.redistribute(tgt)


def test_sharded_array_checks_the_mesh_shape(comm):
    mesh = ps.Mesh(comm, (comm.size, 1))
    lay = ps.Layout((4, 3), "float64", (comm.size,), [Replicate()])
    with pytest.raises(ValueError, match="mesh of shape"):
        ps.ShardedArray(np.zeros((4, 3)), lay, mesh)


def test_sharded_array_arguments_and_numpy_interop(comm):
    """The constructor names a wrong argument with a TypeError (it was an AttributeError from
    inside), and numpy refuses a ShardedArray with a TypeError saying what to use (it took
    it as an opaque object: np.asarray(x) a 0-d object array, np.sum(x) x itself)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size, 3), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    for args, match in (((x.local.tolist(), x.layout, mesh), "local must be"),
                        ((x.local, "Shard(0)", mesh), "layout must be"),
                        ((x.local, x.layout, comm), "mesh must be")):
        with pytest.raises(TypeError, match=match):
            ps.ShardedArray(*args)
    for f in (np.asarray, np.sum, lambda a: np.add(a, 1), lambda a: np.array([a, a])):
        with pytest.raises(TypeError, match=r"x\.local .* or x\.full\(\)"):
            f(x)
    np.testing.assert_array_equal(np.asarray(x.local), g[x.box])
    mesh.free()


def test_sub_dims_takes_a_name(comm):
    m = ps.Mesh(comm, (1, comm.size), names=("dp", "tp"))
    assert m.sub_dims("tp") is m.sub_dims(("tp",)) is m.sub("tp")
    assert m.sub_dims("tp").Get_size() == comm.size
    with pytest.raises(ValueError, match="no dim named 'dptp'"):
        m.sub_dims("dptp")


def test_freed_mesh_says_so(comm):
    m = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(make_global((5, 3), "float64"), m, [Shard(0)])
    for _ in range(2):
        x.redistribute([Shard(1)])
    m.free()
    for fn in (lambda: x.redistribute([Shard(1)]), lambda: x.redistribute([Replicate()]),
               lambda: x.redistribute([Shard(0)]),
               lambda: ps.from_local(x.local, m, [Shard(0)]),
               lambda: ps.from_local(x.local, m, [Shard(0)], global_shape=(5, 3), validate=True),
               lambda: m.sub(0), lambda: m.core_comm((0,)),
               lambda: ps.balance(x), lambda: ps.take(x, np.arange(2)),
               lambda: ps.gather_plan(np.arange(2), like=x)):
        no_comm(fn, RuntimeError, r"this mesh was freed \(Mesh.free\(\)\)")
    # validation's agreement runs first: it raised the MPI library's message about a null
    # communicator (and balance did without validation)
    ps.set_validation(True)
    try:
        for fn in (lambda: ps.balance(x), lambda: ps.gather_plan(np.arange(2), like=x),
                   lambda: ps.take(x, np.arange(2)), lambda: pf.fftn(x)):
            no_comm(fn, RuntimeError, r"this mesh was freed \(Mesh.free\(\)\)")
    finally:
        ps.set_validation(False)
    m.free()  # twice: nothing left to free


def test_a_sub_communicator_freed_by_the_caller(comm):
    """Mesh.sub() hands out the mesh's own communicator; a caller that frees it gets a
    clear RuntimeError from the mesh's next use of it, and Mesh.free() still frees the rest
    (it raised MPI's 'Invalid communicator' part way, and the mesh could be neither used
    nor freed)."""
    m = ps.Mesh(comm, (comm.size, 1))
    x = ps.distribute(make_global((6, 4), "float64"), m, [Shard(0), Replicate()])
    m.sub(0).Free()
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"mesh dims \(0,\) was freed by the caller"):
            m.sub(0)
    m.sub(1).Dup().Free()  # a Dup is the caller's own
    y = x.redistribute([Shard(1), Replicate()])
    np.testing.assert_array_equal(y.local, make_global((6, 4), "float64")[y.box])
    m.free()
    assert m.comm == ps.mesh.MPI.COMM_NULL
    m.free()


def test_mesh_free(comm):
    for _ in range(3):
        m = ps.Mesh(comm, (comm.size, 1))
        x = ps.distribute(make_global((5, 3), "float64"), m, [Shard(0), Replicate()])
        x.redistribute([Shard(1), Replicate()])
        m.free()
        assert m.comm == ps.mesh.MPI.COMM_NULL


@pytest.mark.parametrize(
    "kind", ["fortran", "strided", "readonly", "bigendian", "scalar", "0d"]
)
def test_unusual_inputs(comm, kind):
    """Fortran-order, strided, read-only and big-endian arrays and numpy scalars are taken
    as they come (copied to a C-contiguous native shard where they must be): the result
    equals the numpy oracle."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(7 * 5, dtype=np.float64).reshape(7, 5) - 11.5
    if kind == "fortran":
        a = np.asfortranarray(g)
    elif kind == "strided":
        big = np.zeros((14, 10))
        big[::2, ::2] = g
        a = big[::2, ::2]
    elif kind == "readonly":
        a = g.copy()
        a.setflags(write=False)
    elif kind == "bigendian":
        a = g.astype(">f8")
    elif kind == "scalar":
        a, g = np.float64(3.25), np.array(3.25)
    else:
        a, g = np.array(3.25), np.array(3.25)
    placements = [Replicate()] if g.ndim == 0 else [Shard(0)]
    x = ps.distribute(a, mesh, placements)
    assert x.local.flags.c_contiguous
    np.testing.assert_array_equal(x.local, g[x.box] if g.ndim else g)
    if g.ndim:
        y = x.redistribute([Shard(1)])
        np.testing.assert_array_equal(y.local, g[y.box])
        np.testing.assert_array_equal(y.full(), g)
        z = ps.from_local(a[x.box], mesh, [Shard(0)], global_shape=g.shape)
        np.testing.assert_array_equal(z.redistribute([Replicate()]).local, g)
    else:
        np.testing.assert_array_equal(x.full(), g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.numerics  # MPICH's report of a truncated message (other libraries word it apart)
def test_a_truncated_message_names_the_likely_cause(comm):
    """Ranks that disagree on a dtype without validation, on MPI's path: a rank that gets a
    longer message than it expects raised MPI's own "See the MPI_ERROR field in MPI_Status"
    alone; the error now says the ranks may disagree on the arrays and names PYSHARD_VALIDATE.
    (A rank that gets a shorter one is not told: documented in troubleshooting.md.)"""
    mesh = ps.Mesh(comm, (comm.size,))
    n = 8 * comm.size
    dt = "float32" if comm.rank == 0 else "float64"  # rank 0 expects half the bytes
    g = make_global((n, n), dt)
    lay = ps.Layout((n, n), dt, (comm.size,), [Shard(0)])
    x = ps.from_local(g[lay.box(mesh.coords)], mesh, [Shard(0)], (n, n))
    raised = None
    with ps.config.override(PYSHARD_SHM="off", PYSHARD_VALIDATE=False):
        try:
            x.redistribute([Shard(1)], algorithm="alltoallv")
        except RuntimeError as e:
            raised = str(e)
    every = comm.allgather(raised)
    assert any(e is not None for e in every), every  # rank 0's receive is truncated
    for e in every:
        if e is not None:
            assert "PYSHARD_VALIDATE=1" in e and "disagree" in e, e
    mesh.free()
