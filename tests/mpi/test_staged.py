"""The staging transport (pack, copy to a bounce buffer, MPI on host memory, copy back,
unpack), forced on host arrays: every line of the GPU path but the CUDA calls and kernels
runs here, against the same numpy oracle and with exact collective counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from oracle import ML_DTYPES, collectives_by_rule, make_global
from test_redistribute_1d import (
    PAIRS,
    counts_since,
    expected_counts,
    sweep_pair,
)
from test_redistribute_nd import MESHES, S
from test_redistribute_nd import make_source as make_source_nd

import pyshard as ps
from pyshard import Partial, Replicate
from pyshard.executor import executors, run_steps
from pyshard.many import FusedExchange
from pyshard.route import route

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

DTYPES = ["float16", "float64", "int32", "bool", "complex128", *ML_DTYPES[:1]]  # + bfloat16


@pytest.fixture
def staged():
    """Host arrays through the staging path: steps built in the test take it (the setting
    names it, the route gives it to each step as it is built, and node-shared memory is off)."""
    with ps.config.override(PYSHARD_TRANSPORT="staged"):
        yield


@pytest.mark.parametrize("algorithm", ["auto", "alltoall", "p2p", "alltoallw"])
def test_1d_pairs_staged(comm, staged, algorithm):
    def want(src, dst, p, shape, algorithm):
        w = expected_counts(src, dst, p, shape, algorithm)
        if "alltoallw" in w:  # a staged Alltoallw is an Alltoallv of packed blocks
            w = {"alltoallv": w.pop("alltoallw")}
        if w:
            w["staged"] = sum(w.values())
        return w

    failures = []
    for src, dst in PAIRS:
        failures += sweep_pair(comm, src, dst, algorithm, DTYPES, want)
    assert not failures, "\n".join(failures[:10])


def test_nd_staged_equals_direct(comm, staged):
    """2-D and 3-D meshes: staged results are bitwise those of the direct path and of numpy,
    every collective staged, as many as planning.md's rules give for the pair of layouts
    (oracle.collectives_by_rule); A -> B -> A is bitwise."""
    meshes = MESHES.get(comm.size, [])
    if not meshes:
        pytest.skip(f"no N-D mesh case for {comm.size} ranks")
    R, P = Replicate(), Partial("sum")
    failures = []
    for mesh_shape in meshes:
        mesh = ps.Mesh(comm, mesh_shape)
        nd = len(mesh_shape)
        shape = (7, 5, 3)[:nd] if nd == 3 else (7, 10)
        g = make_global(shape, "int64", seed=5)
        opts = [R, S(0), S(1)] + ([S(2)] if nd == 3 else [])
        sources = list(itertools.product(opts + [P], repeat=nd))[:24]
        targets = list(itertools.product(opts, repeat=nd))[:12]
        for src in sources:
            x, _ = make_source_nd(g, mesh, list(src))
            for dst in targets:
                target = ps.Layout(shape, g.dtype, mesh_shape, list(dst))
                want = collectives_by_rule(x.layout, target)
                before = ps.comm_stats()
                y = x.redistribute(list(dst))
                got = counts_since(before)
                try:
                    assert got.pop("staged", 0) == want, (got, want, str(x.plan_to(list(dst))))
                    assert sum(got.values()) == want, (got, want)
                    np.testing.assert_array_equal(y.local, g[y.box])
                    if not any(isinstance(q, Partial) for q in src):
                        back = y.redistribute(list(src))
                        np.testing.assert_array_equal(back.local, x.local)
                except AssertionError as e:
                    failures.append(f"{mesh_shape} {src}->{dst}: {e}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:8])


@pytest.mark.mpi(min_size=2)
def test_staged_uses_the_pool(comm, staged):
    """The staging buffers come from the mesh's pool and are released with the mesh."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((8 * comm.size, 6 * comm.size), "float32")
    x = ps.distribute(g, mesh, [S(0)])
    y = x.redistribute([S(1)])
    held = mesh.cache.workspace.held
    assert held > 0
    for _ in range(3):
        y = x.redistribute([S(1)])
    assert mesh.cache.workspace.held == held  # reused, not grown
    np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()
    assert mesh.cache.workspace.held == 0


@pytest.mark.mpi(min_size=2)
def test_a_step_keeps_the_transport_it_was_built_with(comm):
    """Steps of each kind built on one mesh under PYSHARD_TRANSPORT=staged and under =direct,
    kept, then run under each setting in turn: each runs on the transport its route chose
    when it was built (a "staged" count, or none), whatever the setting when it runs; a call
    made under a setting builds its steps on that setting's transport. The kinds: the
    exchange, the gather, both reductions (executor steps), a fused exchange
    (redistribute_many's), a halo update and a fold (kept by their HaloArray)."""
    mesh = ps.Mesh(comm, (comm.size,))
    P = comm.size
    g = make_global((6 * P, 4 * P), "int64", seed=3)
    kinds = {  # source -> target: the one collective step of its plan
        "alltoallv": ([S(0)], [S(1)]),
        "allgatherv": ([S(0)], [Replicate()]),
        "reduce_scatter": ([Partial("sum")], [S(0)]),
        "allreduce": ([Partial("sum")], [Replicate()]),
    }
    built = {}
    for t in ("staged", "direct"):
        with ps.config.override(PYSHARD_TRANSPORT=t):
            for name, (src, dst) in kinds.items():
                x, _ = make_source_nd(g, mesh, src)
                p = x.plan_to(dst)
                execs = executors(p, mesh)
                assert [e.step.kind for e in execs] == [name], str(p)
                assert execs[0].route.transport == t
                assert execs[0].core.transport.name == t  # the core step's own transport
                built[t, name] = lambda execs=execs, p=p, x=x: run_steps(execs, p, mesh,
                                                                         x.local, None)
            x = ps.distribute(g, mesh, [S(0)])
            p = x.plan_to([S(1)])
            fused = FusedExchange([p], mesh, False, route(p.steps[0], mesh, "auto"))
            assert fused.core.transport.name == t
            built[t, "fused"] = lambda fused=fused, x=x: fused.run([x.local], False)[0]
            h = ps.distribute(g, mesh, [S(0)]).with_halo(1, periodic=True)
            assert h.route.transport == t and h.fold_route.transport == t
            built[t, "halo"] = lambda h=h: h.update()
            built[t, "halo_fold"] = lambda h=h: h.fold("max")
    def box(placements):
        return g[ps.Layout(g.shape, g.dtype, mesh.shape, placements).box(mesh.coords)]

    want = {"alltoallv": box([S(1)]), "fused": box([S(1)]), "allgatherv": g,
            "reduce_scatter": box([S(0)]), "allreduce": g}  # fmt: skip
    failures = []
    for now in ("direct", "staged", "direct"):  # the setting when they run
        with ps.config.override(PYSHARD_TRANSPORT=now):
            before = ps.comm_stats()
            y = ps.distribute(g, mesh, [S(0)]).redistribute([S(1)])  # built under `now`
            assert counts_since(before).get("staged", 0) == (now == "staged")
            np.testing.assert_array_equal(y.local, g[y.box])
            for (t, name), run in built.items():
                before = ps.comm_stats()
                res = run()
                got = counts_since(before)
                if got.get("staged", 0) != (t == "staged") or sum(got.values()) != 1 + (
                    t == "staged"
                ):
                    failures.append(f"built {t}, run under {now}: {name} counted {got}")
                if name in want:
                    np.testing.assert_array_equal(res, want[name], err_msg=name)
    assert not failures, "\n".join(failures)
