"""The validation mode turns rank mismatches (a user bug that hangs every rank otherwise) into
the same ValueError on every rank; off, it costs nothing."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import make_global

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)


@pytest.fixture
def validating():
    ps.set_validation(True)
    try:
        yield
    finally:
        ps.config.reset("PYSHARD_VALIDATE")  # (set_validation is config.set: undone so)


def _all_raise(comm, fn, *needles):
    """fn() raises ValueError on this rank; every rank gets the same text, naming needles."""
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert comm.allgather(msg) == [msg] * comm.size
    for n in needles:
        assert n in msg, msg
    return msg


def _mesh(comm):
    return ps.Mesh(comm, (comm.size,))


two_ranks = pytest.mark.mpi(min_size=2)  # a mismatch needs two ranks


@two_ranks
def test_different_targets(comm, validating):
    mesh = _mesh(comm)
    x = ps.distribute(make_global((4, 6), "float64"), mesh, [Shard(0)])
    target = [Shard(1)] if comm.rank == 0 else [Replicate()]
    others = "ranks " + ", ".join(map(str, range(1, comm.size))) if comm.size > 2 else "rank 1"
    _all_raise(comm, lambda: x.redistribute(target), "target layout", "rank 0: ", others)


@two_ranks
def test_different_sizes(comm, validating):
    mesh = _mesh(comm)
    g = make_global((5, 3), "int32")
    x = ps.distribute(g, mesh, [Shard(0)])
    last = comm.size - 1
    sizes = {0: [5] + [0] * last} if comm.rank == last else None
    _all_raise(comm, lambda: x.redistribute([Shard(0)], sizes=sizes), "sizes=", f"rank {last}")


@two_ranks
def test_different_settings(comm, validating):
    """A setting that chooses the collectives, other on one rank (node-shared memory from 0
    bytes there, by MPI on the others): every rank raises, naming it, instead of waiting in
    different calls."""
    mesh = _mesh(comm)
    x = ps.distribute(make_global((8, 8), "float64"), mesh, [Shard(0)])
    last = comm.size - 1
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0 if comm.rank == last else None):
        _all_raise(comm, lambda: x.redistribute([Shard(1)]), "settings:", f"rank {last}: ",
                   "PYSHARD_SHM_MIN_BYTES=0")
    y = x.redistribute([Shard(1)])  # the same settings again: no error
    np.testing.assert_array_equal(y.local, make_global((8, 8), "float64")[y.box])


@two_ranks
@pytest.mark.parametrize("case", ["PYSHARD_ALGORITHM redistribute", "PYSHARD_ALGORITHM many",
                                  "PYSHARD_HALO_METHOD halo", "PYSHARD_SHM halo"])
def test_a_refused_setting_on_one_rank_raises_everywhere(comm, validating, monkeypatch, case):
    """A setting whose value pyshard refuses, on one rank only, read before the call's
    agreement (the default algorithm; a halo array's method and route, read when it is
    built): that rank raised alone and the others waited in their agreement for it. Every
    rank now raises, the settings line naming it."""
    name, op = case.split()
    mesh = _mesh(comm)
    g = make_global((8 * comm.size, 8), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    last = comm.size - 1
    if comm.rank == last:
        monkeypatch.setenv(name, "bogus")
        ps.config.refresh()
    try:
        def call():
            if op == "redistribute":
                x.redistribute([Shard(1)])
            elif op == "many":
                ps.redistribute_many([x, x], [Shard(1)])
            else:
                x.with_halo(1).update()
        _all_raise(comm, call, "settings:", f"rank {last}: ", f"{name}=invalid 'bogus'")
    finally:
        monkeypatch.delenv(name, raising=False)
        ps.config.refresh()
    y = x.redistribute([Shard(1)])  # in step again
    np.testing.assert_array_equal(y.local, g[y.box])


@two_ranks
def test_bad_input_on_one_rank_raises_everywhere(comm, validating):
    mesh = _mesh(comm)
    x = ps.distribute(make_global((4, 6), "float64"), mesh, [Shard(0)])
    target = [Shard(5)] if comm.rank == 0 else [Shard(1)]
    _all_raise(comm, lambda: x.redistribute(target), "invalid", "rank 0")


@two_ranks
def test_a_bad_out_or_local_dtype_on_one_rank_raises_everywhere(comm, validating):
    """An out= of the wrong shape or dtype, or a .local replaced by another dtype, on one
    rank: every rank raises, naming it (that rank raised before its check and the others
    waited in theirs for ever)."""
    mesh = _mesh(comm)
    g = make_global((4, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    last = comm.size - 1
    want = x.plan_to([Shard(1)]).dst.local_shape(mesh.coords)
    for bad in (np.empty(want, np.float32), np.empty((want[0] + 1, want[1]))):
        out = bad if comm.rank == last else np.empty(want)
        _all_raise(comm, lambda o=out: x.redistribute([Shard(1)], out=o), "out:", "refused",
                   f"rank {last}")
    y = ps.distribute(g, mesh, [Shard(0)])
    if comm.rank == last:
        y.local = y.local.astype(np.float32)
    msg = _all_raise(comm, lambda: y.redistribute([Shard(1)]), f"rank {last}")
    assert "float32" in msg, msg
    z = x.redistribute([Shard(1)], out=np.empty(want))  # in step again
    np.testing.assert_array_equal(z.local, g[z.box])


def test_out_on_some_ranks_only_passes(comm, validating):
    """out= given on rank 0 alone (each rank decides for its own result): the validation
    passes it and the results are exact (a first form of the out= check refused it)."""
    mesh = _mesh(comm)
    g = make_global((4, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    want = x.plan_to([Shard(1)]).dst.local_shape(mesh.coords)
    out = np.empty(want) if comm.rank == 0 else None
    y = x.redistribute([Shard(1)], out=out)
    assert (y.local is out) == (comm.rank == 0)
    np.testing.assert_array_equal(y.local, g[y.box])


@two_ranks
def test_gather_plan_rows_of_another_dtype_on_one_rank(comm, validating):
    """A gather plan run on rows of another dtype (or row shape) on one rank: every rank
    raises the validation's ValueError naming the array (the check compared the plan and
    the call only, and the exchange raised a message-size error on some ranks)."""
    mesh = _mesh(comm)
    g = make_global((4 * comm.size, 2), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    idx = np.arange(4 * comm.size)
    plan = ps.gather_plan(idx, like=x)
    last = comm.size - 1
    for h in (g.astype(np.float32), np.repeat(g, 2, axis=1)):
        y = ps.distribute(h if comm.rank == last else g, mesh, [Shard(0)])
        _all_raise(comm, lambda y=y: plan.gather(y), "array", f"rank {last}")
    np.testing.assert_array_equal(plan.gather(x), g[idx])


@two_ranks
def test_gather_plan_and_fft_plan_arguments_on_one_rank(comm, validating):
    """gather_plan's algorithm= or method=, and an FFTPlan's forward/backward algorithm=,
    different on one rank: every rank raises the validation's ValueError naming them (the
    setup's exchange and the transposes hung, or one rank raised at PYSHARD_PEER_TIMEOUT);
    agreeing calls give the oracle."""
    from pyshard import fft as pf

    mesh = _mesh(comm)
    last = comm.size - 1
    g = make_global((4 * comm.size, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    idx = np.arange(3)
    for kw in ({"algorithm": "nbx"}, {"method": "neighbor"}, {"method": "tune"}):
        key = next(iter(kw))
        mine = kw if comm.rank == last else {key: "alltoall" if key == "algorithm" else "p2p"}
        _all_raise(comm, lambda mine=mine: ps.gather_plan(idx, like=x, **mine), key,
                   f"rank {last}")
    np.testing.assert_array_equal(ps.gather_plan(idx, like=x).gather(x), g[idx])
    p = pf.plan(x.layout, "fftn")
    alg = "p2p" if comm.rank == last else "alltoallv"
    _all_raise(comm, lambda: p.forward(x, algorithm=alg), "FFTPlan.forward", "algorithm")
    y = p.forward(x)
    _all_raise(comm, lambda: p.backward(y, algorithm=alg), "FFTPlan.backward", "algorithm")
    np.testing.assert_allclose(y.redistribute([Replicate()]).local, np.fft.fftn(g), atol=1e-9)


@two_ranks
def test_different_calls(comm, validating):
    mesh = _mesh(comm)
    g = make_global((4, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    if comm.rank == 0:
        fn = lambda: ps.from_local(x.local, mesh, [Shard(0)], global_shape=g.shape)  # noqa: E731
    else:
        fn = lambda: x.redistribute([Shard(1)])  # noqa: E731
    _all_raise(comm, fn, "different calls", "from_local", "redistribute")


@two_ranks
def test_from_local_shapes_checked_everywhere(comm, validating):
    mesh = _mesh(comm)
    g = make_global((3 * comm.size, 4), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    local = x.local if comm.rank else x.local[:1]  # rank 0 passes too few rows
    _all_raise(
        comm,
        lambda: ps.from_local(local, mesh, [Shard(0)], global_shape=g.shape),
        "rank 0",
    )


@two_ranks
def test_load_arguments_agree(comm, validating, tmp_path):
    mesh = _mesh(comm)
    path = comm.bcast(str(tmp_path / "ckpt") if comm.rank == 0 else None, root=0)
    g = make_global((6, 4), "float64")
    ps.save(path, {"a": ps.distribute(g, mesh, [Shard(0)])})
    want = [Shard(1)] if comm.rank == 0 else [Shard(0)]
    _all_raise(comm, lambda: ps.load(path, mesh, {"a": want}), "placements", "rank 0")
    y = ps.load(path, mesh, {"a": [Shard(1)]})["a"]  # agreeing ranks load fine
    np.testing.assert_array_equal(y.local, g[y.box])


def test_agreeing_calls_give_the_oracle(comm, validating):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((7, 5), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    for dst in ([Shard(1)], [Replicate()], [Partial("sum")], [Shard(0)]):
        y = x.redistribute(dst)
        ref = y.full() if isinstance(dst[0], Partial) else y.local
        np.testing.assert_array_equal(ref, g if isinstance(dst[0], Partial) else g[y.box])
    assert ps.validation()


def test_environment_switch(monkeypatch):
    """The variable is parsed, and the validation mode follows it from its next read."""
    try:
        monkeypatch.setenv("PYSHARD_VALIDATE", "yes")
        assert ps.config.get("PYSHARD_VALIDATE") is True
        assert ps.validation()  # the mode follows the variable
        monkeypatch.setenv("PYSHARD_VALIDATE", "off")
        ps.config.refresh()
        assert not ps.validation()
        monkeypatch.setenv("PYSHARD_VALIDATE", "maybe")
        with pytest.raises(ValueError, match="PYSHARD_VALIDATE must be 0/1, false/true, no/yes "
                                             "or off/on, got 'maybe'"):
            ps.config.get("PYSHARD_VALIDATE")
    finally:
        monkeypatch.undo()  # the variable as it was
        ps.config.refresh()  # and the mode with it


@two_ranks
def test_halo_update_checked_at_every_call(comm, validating):
    """A halo update is validated at every call, as a fold is: after a first update on every
    rank, one rank folding while the others update raises on every rank (the update was
    validated at its first call only, so the ranks waited in mismatched exchanges)."""
    mesh = _mesh(comm)
    g = make_global((4 * comm.size, 5), "float64")
    h = ps.distribute(g, mesh, [Shard(0)]).with_halo(1, periodic=True)
    h.update()
    h.update()
    fn = h.fold if comm.rank == 0 else h.update
    _all_raise(comm, fn, "halo")
    h.update()  # agreeing again: runs
    mesh.free()


@two_ranks
@pytest.mark.parametrize("replaced", ["shape", "dtype"])
def test_halo_of_a_replaced_local(comm, validating, replaced):
    """One rank replaced its .local by an array of another shape, or of another dtype of the
    same item size (float64 -> int64): with_halo refuses it there, and every rank raises at
    its first update. The dtype was not checked at all (the fold read float64 bytes as
    int64 on that rank) and the shape only by the core after the agreement (the other ranks
    waited in the exchange)."""
    mesh = _mesh(comm)
    g = make_global((4 * comm.size, 5), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    last = comm.size - 1
    if comm.rank == last:
        x.local = x.local[:-1] if replaced == "shape" else x.local.astype(np.int64)
    if comm.rank == last:
        _all_raise(comm, lambda: x.with_halo(1, periodic=True), "was .local replaced")
    else:
        h = x.with_halo(1, periodic=True)
        _all_raise(comm, h.update, "was .local replaced")
    mesh.free()


@two_ranks
@pytest.mark.parametrize("replaced", ["shape", "dtype"])
@pytest.mark.parametrize("call", ["fftn", "plan", "backward"])
def test_fft_of_a_replaced_local(comm, validating, replaced, call):
    """One rank replaced its .local by an array of another shape, or of another dtype of the
    same item size (float64 -> int64): every rank raises. The dtype was not checked at all
    (the int64 bytes were transformed as float64: a wrong result on every rank)."""
    import pyshard.fft  # noqa: F401 - ps.fft below

    mesh = _mesh(comm)
    g = make_global((2 * comm.size, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    plan = ps.fft.plan(x.layout, "fftn") if call != "fftn" else None
    if call == "backward":  # (complex128: no other dtype has its item size; complex64's half)
        x = plan.forward(x)
    if comm.rank == comm.size - 1:
        x.local = x.local[:-1] if replaced == "shape" else x.local.astype(
            np.int64 if x.local.dtype == np.float64 else np.complex64)
    run = {"fftn": lambda: ps.fft.fftn(x), "plan": lambda: plan.forward(x),
           "backward": lambda: plan.backward(x)}[call]
    _all_raise(comm, run, "was .local replaced", "local shard")
    mesh.free()


@two_ranks
@pytest.mark.parametrize("func", ["fftn", "dstn"])
def test_fft_into_its_input_beside_an_empty_shard(comm, validating, func):
    """fftn(x, out=x) where some ranks hold empty shards: whether out shares x's memory is
    each rank's own fact (an empty shard never does), and the ranks that shared it ran a
    second validation check the others did not: a ValueError "ranks are in different calls"
    at 2 ranks, a hang at 3. The result must be numpy's, as without the validation mode."""
    import pyshard.fft as pf

    sf = pytest.importorskip("scipy.fft", reason="the DST needs scipy (pyshard[fft])") \
        if func == "dstn" else None
    mesh = _mesh(comm)
    g = make_global((2, 3), "complex128" if func == "fftn" else "float64")
    x = ps.distribute(g, mesh, [Shard(1)], sizes={1: [3] + [0] * (comm.size - 1)})
    y = getattr(pf, func)(x, axes=[0], out=x)
    assert y is x
    ref = np.fft.fftn(g, axes=[0]) if func == "fftn" else \
        sf.dstn(g, axes=[0])
    np.testing.assert_allclose(y.local, ref[y.box], rtol=1e-12, atol=1e-12)
    mesh.free()


@two_ranks
def test_errors_on_a_sub_communicator_name_world_ranks(comm, validating):
    """On a mesh whose ranks are not the world's (here in reverse order), the errors that
    name a rank give its world rank beside it: the validation mode's, migrate's and
    gather_plan's (they named the mesh rank alone, which reads as a world rank)."""
    from mpi4py import MPI

    rev = MPI.COMM_WORLD.Split(0, -MPI.COMM_WORLD.rank)
    mesh = ps.Mesh(rev, (rev.size,))
    last = rev.size - 1  # world rank 0
    g = make_global((4 * rev.size, 3), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    target = [Replicate()] if mesh.rank == last else [Shard(1)]
    _all_raise(rev, lambda: x.redistribute(target), f"rank {last} (world rank 0)")
    dest = np.zeros(2, np.int64)
    if mesh.rank == last:
        dest[1] = rev.size  # outside [0, P)
    # (the rank at fault adds its detail: every rank raises, the texts differ)
    with pytest.raises(ValueError, match=rf"rank {last} \(world rank 0\)'s input is bad"):
        ps.migrate({"a": np.zeros(2)}, dest, mesh)
    idx = np.array([g.shape[0] if mesh.rank == last else 0])
    with pytest.raises(ValueError, match=rf"rank {last} \(world rank 0\)'s indices are bad"):
        ps.gather_plan(idx, like=x)
    mesh.free()
    rev.Free()


@two_ranks
def test_more_arguments_on_one_rank(comm, validating, tmp_path):
    """One rank's different (or bad) argument raises the same ValueError on every rank:
    redistribute's wait= (a hang), an FFTPlan built with another norm (a wrong result), a
    fold's bad op, a gather_plan like= of another layout, save's format or metadata, an
    fft's workers= and a Mesh of another shape (the bad ones raised on that rank alone and
    the others waited until PYSHARD_PEER_TIMEOUT; the Mesh ended the job in MPI)."""
    from pyshard import fft as pf

    mesh = _mesh(comm)
    last = comm.size - 1
    odd = comm.rank == last
    g = make_global((4 * comm.size, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])

    def redistribute():
        r = x.redistribute([Shard(1)], wait=not odd)
        return r if not odd else r.wait()

    _all_raise(comm, redistribute, "wait", f"rank {last}")
    p = pf.plan(x.layout, "fftn", norm="ortho" if odd else "backward")
    _all_raise(comm, lambda: p.forward(x), "norm", f"rank {last}")
    h = x.with_halo(1, periodic=True)
    _all_raise(comm, lambda: h.fold(op="bogus" if odd else "sum"), "op must be one of",
               f"rank {last}")
    like = ps.distribute(g, mesh, [Shard(1)] if odd else [Shard(0)])
    _all_raise(comm, lambda: ps.gather_plan(np.arange(2), like=like), "index space",
               f"rank {last}")
    path = comm.bcast(str(tmp_path / "ck") if comm.rank == 0 else None)
    for kw, says in (({"format": "bogus" if odd else "npy"}, "format"),
                     ({"metadata": {"lr": float("nan") if odd else 0.1}}, "non-finite"),
                     ({"metadata": {"step": 2 if odd else 1}}, "metadata")):
        _all_raise(comm, lambda kw=kw: ps.save(path, {"x": x}, **kw), says, f"rank {last}")
    _all_raise(comm, lambda: pf.fftn(x, workers="x" if odd else None), "refused",
               f"rank {last}: TypeError")  # (scipy.fft's own error for workers="x")
    _all_raise(comm, lambda: ps.Mesh(comm, (comm.size,) if odd else (1, comm.size)),
               "shape", f"rank {last}")
    y = x.redistribute([Shard(1)])  # agreeing calls run
    np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


@two_ranks
def test_the_same_argument_spelled_otherwise_agrees(comm, validating):
    """A tuple on one rank and a list on the others (from_local's placements and
    global_shape, an fft's axes), norm=None beside "backward": the same call, which runs
    (each was reported as a difference)."""
    from pyshard import fft as pf

    mesh = _mesh(comm)
    odd = comm.rank == comm.size - 1
    g = make_global((4 * comm.size, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    y = ps.from_local(x.local, mesh, (Shard(0),) if odd else [Shard(0)],
                      global_shape=list(g.shape) if odd else g.shape)
    np.testing.assert_array_equal(y.full(), g)
    f = pf.fftn(x, axes=[0, 1] if odd else (0, 1), norm=None if odd else "backward")
    np.testing.assert_allclose(f.full(), np.fft.fftn(g), atol=1e-9)
    mesh.free()


@two_ranks
def test_torch_bad_argument_on_one_rank(comm, validating):
    """pyshard.torch.redistribute to a placement the layout cannot take, or halo_pad with an
    unknown method, on one rank: every rank raises (that rank raised alone, the others
    waited until PYSHARD_PEER_TIMEOUT)."""
    torch = pytest.importorskip("torch")
    import pyshard.torch as pst

    mesh = _mesh(comm)
    last = comm.size - 1
    odd = comm.rank == last
    g = make_global((4 * comm.size, 3), "float64")
    x = pst.distribute(torch.tensor(g, requires_grad=True), mesh, [Shard(0)])
    _all_raise(comm, lambda: pst.redistribute(x, [Shard(7)] if odd else [Shard(1)]),
               "redistribute", f"rank {last}")
    _all_raise(comm, lambda: pst.halo_pad(x, 1, method="bogus" if odd else "auto"),
               "halo update", f"rank {last}")
    y = pst.redistribute(x, [Shard(1)])
    np.testing.assert_array_equal(y.local.detach().numpy(), g[:, y.box[1]])
    # the others' target is the layout they have (a no-op there, which skipped its
    # agreement: the odd rank's was answered by their next call, out of step for good)
    for t in (x, pst.distribute(torch.tensor(g), mesh, [Shard(0)])):  # (grad or not)
        _all_raise(comm, lambda t=t: pst.redistribute(t, [Shard(7)] if odd else [Shard(0)]),
                   "redistribute", f"rank {last}")
        z = pst.redistribute(t, [Replicate()])
        np.testing.assert_array_equal(z.local.detach().numpy(), g)
    mesh.free()
