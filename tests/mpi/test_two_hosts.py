"""What only a job across two hosts can show (scripts/two-nodes.sh: two hosts on one machine,
each a network namespace with its own host name, boot id, process ids and /dev/shm, MPI over
TCP on a veth pair between them; docs/testing.md "Two hosts on one machine").

pyshard's node map groups ranks by machine key (host name, boot id, pid namespace, user):
ranks of one host share memory, the other host is reached by MPI in the same step. On one
host, ``PYSHARD_NODE_SIZE`` can only pretend: these tests run the real grouping, the real
``/proc/<pid>/fd`` opens with pids that repeat across hosts, a ``/dev/shm`` per host and TCP
between hosts. They skip unless the job spans exactly two hosts (the tests at the end start
such a job of their own from a run at size 1, where root can make the hosts).
Which path each step should take comes from the host names alone (oracle.world_hosts), never
from pyshard's node map."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time

import launch
import numpy as np
import pytest
from mpi4py import MPI
from oracle import contributions, make_global, node_blocks, node_groups, world_hosts
from test_faults import left_running, raised_lines
from test_halo import check_halo, check_split, counted, node_peers, padded_with_fill
from test_redistribute_nd import counts_since

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.explain import explain

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "two-nodes.sh")
R = Replicate()
GATHERS = ("allgather", "allgatherv")
REDUCTIONS = ("reduce_scatter", "reduce_scatter_block", "allreduce")
IFACE_STATS = "/sys/class/net/psh0/statistics"  # the veth end of this host (two-nodes.sh)


@pytest.fixture
def two_hosts(comm, monkeypatch):
    """Skip unless the job spans two hosts, a mesh over COMM_WORLD; node-shared memory on for
    every size, the machine's own nodes (no PYSHARD_NODE_SIZE)."""
    hosts = world_hosts()
    if len(set(hosts)) != 2 or comm.size != MPI.COMM_WORLD.size:
        pytest.skip("needs a job across two hosts (scripts/two-nodes.sh)")
    monkeypatch.setenv("PYSHARD_TRANSPORT", "auto")
    monkeypatch.delenv("PYSHARD_NODE_SIZE", raising=False)
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "0")
    return hosts


def facts():
    """What tells this rank's machine apart: host name, boot id, pid namespace, /dev/shm."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return (socket.gethostname(), boot, os.stat("/proc/self/ns/pid").st_ino,
            os.stat("/dev/shm").st_dev, os.getpid())  # fmt: skip


def test_the_node_map_sees_two_nodes(comm, two_hosts):
    """The mesh's node map puts the ranks of each host in one node and the two hosts in two:
    keys equal exactly where the hosts are; the node transport of the whole mesh spans 2 nodes
    with this host's ranks as node peers. Each host has its own host name, boot id, pid
    namespace and /dev/shm, and a mesh of each host's ranks alone is one node of them all."""
    hosts, me = two_hosts, two_hosts[comm.rank]
    seen = comm.allgather(facts())
    for r, f in enumerate(seen):
        for i in range(4):  # host name, boot id, pid namespace, /dev/shm: per host
            assert (f[i] == seen[comm.rank][i]) == (hosts[r] == me), (r, f, seen[comm.rank])
    mesh = ps.Mesh(comm, (comm.size,))
    keys = mesh.node_info()["machine"]
    assert len(set(keys)) == 2, keys
    for r in range(comm.size):
        assert (keys[r] == keys[comm.rank]) == (hosts[r] == me), keys
    node = mesh.node_transport((0,))
    mine = [r for r in range(comm.size) if hosts[r] == me]
    assert node is not None and node.nodes == 2, node
    assert list(node.node_ranks) == mine
    mesh.free()
    # a mesh of this host's ranks: one node, every exchange through node-shared memory
    sub = comm.Split(me, comm.rank)
    local = ps.Mesh(sub, (1, sub.size))
    node = local.node_transport((0, 1))
    assert node is not None and node.nodes == 1 and list(node.node_ranks) == list(range(sub.size))
    g = make_global((4 * sub.size + 1, 3 * sub.size), "int64", seed=me)
    x = ps.distribute(g, local, [R, Shard(0)])
    before = ps.comm_stats()
    y = x.redistribute([R, Shard(1)])
    assert counts_since(before) == {"shm": 1}
    np.testing.assert_array_equal(y.local, g[y.box])
    local.free()
    sub.Free()
    # and a 1 x 1 mesh of one rank: no node map, a local copy
    one = ps.Mesh(MPI.COMM_SELF, (1, 1))
    x = ps.distribute(g, one, [Shard(0), R])
    before = ps.comm_stats()
    np.testing.assert_array_equal(x.redistribute([R, Shard(1)]).local, g)
    assert counts_since(before) == {}
    one.free()


def test_pids_repeat_across_hosts_and_nothing_mixes_them_up(comm, two_hosts):
    """Each host numbers its processes from 1, so ranks on the two hosts have the same pids
    (two-nodes.sh starts them alike): the node map keeps them apart (a rank's node peers are
    the ranks of its host, never a rank of the other host with a node peer's pid), and an
    exchange through node-shared memory on this mesh, which opens its node peers'
    /proc/<pid>/fd, gives the oracle's values."""
    hosts = two_hosts
    pids = comm.allgather(os.getpid())
    on = [{p for p, h in zip(pids, hosts) if h == k} for k in (0, 1)]
    assert on[0] & on[1], f"no pid repeats across the hosts: {pids} (two-nodes.sh's hosts?)"
    mesh = ps.Mesh(comm, (comm.size,))
    assert mesh.node_info()["pid"] == pids
    node = mesh.node_transport((0,))
    for r in range(comm.size):
        if r != comm.rank and pids[r] in on[hosts[comm.rank]]:  # a pid this host also has
            assert (r in node.node_ranks) == (hosts[r] == hosts[comm.rank])
    g = make_global((6 * comm.size + 1, 2 * comm.size + 3), "float64", seed=5)
    x = ps.distribute(g, mesh, [Shard(0)])
    for _ in range(3):  # again: the peers' segments stay mapped
        before = ps.comm_stats()
        y = x.redistribute([Shard(1)])
        assert counts_since(before) == {"shm": 1}
        np.testing.assert_array_equal(y.local, g[y.box])
        x = y.redistribute([Shard(0)])
        np.testing.assert_array_equal(x.local, g[x.box])
    mesh.free()


def meshes(p):
    """1-D, hosts along mesh dim 0 (dim 1 within a host), and the transpose of that (at 6
    ranks, 3 a host, its dim 1 pairs one rank of each host in the middle)."""
    k = p // 2
    return [(p,), (2, k), (k, 2)]


def expected(mesh, step, batch=False):
    """The path of ``step`` on ``mesh`` by the rule, from the hosts alone: an exchange or a
    gather takes node-shared memory where two ranks of its communicator share a host (MPI to
    the others in the same step) and, an exchange, some block of it goes between two such
    ranks (oracle.node_blocks; not asked of a ``batch`` of redistribute_many), a reduction
    where all of them do; else MPI. Also: whether its communicator spans both hosts."""
    groups = node_groups(mesh, step.mesh_dims)
    hosts = {g[0] for g in groups}
    if step.kind in ("alltoallv", "allgatherv"):
        shm = len(set(groups)) < len(groups)
        if shm and step.kind == "alltoallv" and not batch:
            shm = node_blocks(mesh, step)
    else:
        shm = len(set(groups)) == 1 and len(groups) > 1
    return ("shm" if shm else "mpi"), len(hosts) == 2


def check_plan(comm, mesh, x, target, ref, bad, seen, what):
    """Redistribute ``x`` to ``target``: bitwise ``ref`` (and the bits of the same call with
    PYSHARD_TRANSPORT=mpi), each collective step counted where the rule says, and explain()
    naming the path (and, for a step across both hosts, the split)."""
    p = x.plan_to(target)
    want = [expected(mesh, s) if s.is_collective else ("local", False) for s in p.steps]
    text = explain(p, mesh=mesh)
    said = [ln.split("on this mesh: ")[1] for ln in text.splitlines() if "on this mesh: " in ln]
    before = ps.comm_stats()
    y = x.redistribute(target)
    got = counts_since(before)
    with ps.config.override(PYSHARD_TRANSPORT="mpi"):
        z = x.redistribute(target)
    shm = sum(path == "shm" for path, _ in want)
    case = f"{what} {mesh.shape} {x.placements} -> {target}"
    if got.get("shm", 0) != shm or sum(got.values()) != sum(s.is_collective for s in p.steps):
        bad.append(f"{case}: ran {got}, the rule {want}")
    if len(said) != len(want):
        bad.append(f"{case}: explain names {said}, the rule {want}")
    for (path, both), s in zip(want, said):
        seen.add((path, both))
        if not s.startswith(path):
            bad.append(f"{case}: explain says {s}, the rule {path}")
        mixed = path == "shm" and both  # node peers by shared memory, the other host by MPI
        if mixed != ("MPI to the other" in s and "other node(s)" in s):
            bad.append(f"{case}: explain says {s!r} (across both hosts: {both})")
    if not np.array_equal(y.local, ref[y.box]):
        bad.append(f"{case}: not the oracle's values")
    if y.local.tobytes() != z.local.tobytes():
        bad.append(f"{case}: not the bits of the MPI run")


def all_ok(comm, bad):
    bad = [b for r in comm.allgather(bad) for b in r]
    assert not bad, "\n".join(bad[:10])


def test_every_exchange_takes_shared_memory_within_a_host_and_mpi_between(comm, two_hosts):
    """Transposes, gathers, reductions (Reduce_scatter and Allreduce, sum and max) and
    redistribute_many on a 1-D mesh and on 2-D meshes with the hosts along one dim: each step
    counted by comm_stats and named by explain() where the rule says (node-shared memory
    within a host and MPI to the other host in one step; reductions across hosts by MPI),
    bitwise the oracle and the MPI run's bits."""
    bad, seen = [], set()
    p = comm.size
    for mshape in meshes(p):
        mesh = ps.Mesh(comm, mshape)
        nd = len(mshape)
        shape = (3 * p + 1, 2 * p + 1)
        for dtype in ("float64", "int32"):
            g = make_global(shape, dtype, seed=nd)
            opts = [R, Shard(0), Shard(1)]
            for src in itertools.product(opts, repeat=nd):
                x = ps.distribute(g, mesh, list(src))
                for dst in itertools.product(opts, repeat=nd):
                    if dst != src:
                        check_plan(comm, mesh, x, list(dst), g, bad, seen, dtype)
        for mdim in range(nd):  # reductions over each mesh dim
            for dtype, op in (("float64", "sum"), ("int32", "max")):
                parts, ref = contributions(shape, dtype, mshape[mdim], op, seed=mdim)
                pl = [Partial(op) if m == mdim else R for m in range(nd)]
                x = ps.from_local(parts[mesh.coords[mdim]].copy(), mesh, pl, global_shape=shape)
                for t in (Shard(0), Shard(1), R):
                    target = [t if m == mdim else R for m in range(nd)]
                    check_plan(comm, mesh, x, target, ref, bad, seen, f"{op} {dtype}")
        # redistribute_many: three arrays in one handshake where ranks share a host
        gs = [make_global((2 * p + k, p + 2), dt, seed=k)
              for k, dt in enumerate(("float64", "int16", "complex128"))]  # fmt: skip
        xs = [ps.distribute(a, mesh, [Shard(0)] + [R] * (nd - 1)) for a in gs]
        target = [Shard(1)] + [R] * (nd - 1)
        want = expected(mesh, xs[0].plan_to(target).steps[0], batch=True)
        before = ps.comm_stats()
        ys = ps.redistribute_many(xs, target)
        got = counts_since(before)
        if (got != {"shm": 1}) if want[0] == "shm" else ("shm" in got or not got):
            bad.append(f"redistribute_many {mshape}: ran {got}, the rule {want}")
        for a, y in zip(gs, ys):
            if not np.array_equal(y.local, a[y.box]):
                bad.append(f"redistribute_many {mshape} {a.dtype}: not the oracle's values")
        mesh.free()
    all_ok(comm, bad)
    # every kind of step ran: within a host, mixed, and MPI alone across the hosts
    assert {("shm", False), ("shm", True), ("mpi", True)} <= seen, seen


def veth_bytes():
    """Bytes this host's end of the veth pair has sent and received so far."""
    with open(f"{IFACE_STATS}/tx_bytes") as f, open(f"{IFACE_STATS}/rx_bytes") as g:
        return int(f.read()) + int(g.read())


def test_bytes_cross_the_veth_only_between_hosts(comm, two_hosts):
    """A 2 MiB-a-rank transpose whose every peer is on this host moves (next to) nothing over
    the veth pair; on the 1-D mesh, where half of every rank's blocks go to the other host,
    at least those bytes cross it."""
    if not os.path.exists(IFACE_STATS):
        pytest.skip("no psh0 here (not two-nodes.sh's hosts)")
    p = comm.size
    hosts = two_hosts
    rows, cols = 64 * p, 512 * p  # float64: 1 MiB a rank at 4 ranks
    g = make_global((rows, cols), "float64", seed=3)
    sub = comm.Split(hosts[comm.rank], comm.rank)
    for label, c in (("within a host", sub), ("across", comm)):
        mesh = ps.Mesh(c, (c.size,))
        x = ps.distribute(g, mesh, [Shard(0)])
        plan = x.plan_to([Shard(1)])
        comm.Barrier()
        before = veth_bytes()
        comm.Barrier()  # every rank has read the counters before any block moves
        y = x.redistribute([Shard(1)])
        comm.Barrier()
        moved = veth_bytes() - before
        comm.Barrier()
        np.testing.assert_array_equal(y.local, g[y.box])
        if label == "within a host":
            assert moved < 64 << 10, f"{label}: {moved} B crossed the veth"
        else:  # this host's ranks' blocks for the other host's ranks, and theirs for these
            m = len([h for h in hosts if h == hosts[comm.rank]])
            cross = 2 * m * (p - m) * (rows // p) * (cols // p) * 8
            assert moved >= cross, f"{label}: {moved} B crossed the veth, expected >= {cross}"
            assert plan.steps[0].kind == "alltoallv"
        mesh.free()
    sub.Free()


def test_halos_and_folds_split_by_host(comm, two_hosts):
    """Halo updates and folds with method auto and shm on the meshes above: node peers
    (the ranks of this host) by node-shared memory, the other host's ranks by MPI messages in
    the same step (check_split), explain() naming which peers shared memory reaches, the
    oracle's values; a fold through shared memory the bits of persistent requests."""
    p = comm.size
    hosts = two_hosts
    mpi = 0
    for mshape in meshes(p)[1:]:
        mesh = ps.Mesh(comm, mshape)
        shape = (2 * mshape[0] + 3, 3 * mshape[1] + 1)
        g = make_global(shape, "float64", seed=2)
        x = ps.distribute(g, mesh, [Shard(0), Shard(1)])
        for method in ("auto", "shm"):
            for periodic in (False, True):
                h = x.with_halo(1, periodic=periodic, method=method)
                padded_with_fill(h)
                before = ps.comm_stats()
                h.update()
                check_halo(g, x, h, f"{mshape} {method} periodic={periodic}")
                assert h.chosen == "shm", h.chosen
                assert counts_since(before) == {counted(h): 1}
                mpi += check_split(h)
                on = node_peers(mesh)
                assert on == {r for r in range(mesh.size) if r != mesh.rank and
                              hosts[r] == hosts[mesh.rank]}  # fmt: skip
                mine = sorted(r for r in h.plan.peers if r in on)
                text = h.explain()
                assert f"it reaches {len(mine)} of this rank's {len(h.plan.peers)} peer(s) " \
                       f"(ranks {mine}), MPI the others" in text, text  # fmt: skip
                # a fold of random values: the bits of persistent requests
                rng = np.random.default_rng([7, *mesh.coords])
                v = rng.standard_normal(h.padded.shape) * 1e3
                ref_h = x.with_halo(1, periodic=periodic, method="persistent")
                ref_h.padded[...] = v
                ref_h.fold("sum")
                h.padded[...] = v
                before = ps.comm_stats()
                h.fold("sum")
                assert h.fold_chosen == "shm"
                assert counts_since(before) == {"halo_fold_shm": 1}
                mpi += check_split(h, fold=True)
                assert h.interior.tobytes() == ref_h.interior.tobytes()
        mesh.free()
    assert comm.allreduce(mpi) > 0  # some peers were on the other host


def test_nothing_left_in_dev_shm(comm, two_hosts):
    """Meshes, exchanges, halo arrays and their frees leave no file in either host's own
    /dev/shm (pyshard's segments are memfds; two-nodes.sh also looks once the job is over)."""
    def files():
        return {n for n in os.listdir("/dev/shm") if not n.startswith(launch._MPI_SHM)}

    start = files()
    mesh = ps.Mesh(comm, (2, comm.size // 2))
    g = make_global((4 * comm.size, 4 * comm.size), "float32", seed=1)
    x = ps.distribute(g, mesh, [Shard(0), Shard(1)])
    y = x.redistribute([Shard(1), R])
    h = x.with_halo(1, method="shm")
    h.update()
    np.testing.assert_array_equal(y.local, g[y.box])
    del x, y, h
    mesh.free()
    comm.Barrier()
    assert files() == start, sorted(files() - start)


# --- jobs of their own on two hosts, started from a run at size 1 (root, pip's MPICH)


def run_two_hosts(n, args, env=None, timeout=120):
    """``scripts/two-nodes.sh -n N -ppn N/2 -- ARGS``: its completed process; skips where the
    hosts cannot be made here (its exit status 77) or the MPI is not MPICH's Hydra."""
    if not MPI.Get_library_version().startswith("MPICH"):
        pytest.skip("two-nodes.sh launches with MPICH's Hydra")
    cmd = ["bash", SCRIPT, "-n", str(n), "-ppn", str(n // 2), "--", *args]
    e = {"PYSHARD_MPIEXEC": launch.mpiexec(), **(env or {})}
    r = subprocess.run(cmd, env=launch.child_env(e), capture_output=True, text=True,
                       timeout=timeout, start_new_session=True)  # fmt: skip
    if r.returncode == 77:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    return r


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_rank_lost_on_one_host_ends_the_job_on_both(comm, how, tmp_path):
    """Rank 3 (the second host) stops (sleeps) or is killed before the second of two
    exchanges through node-shared memory on 4 ranks: where it stops, its node peer (rank 2)
    raises at PYSHARD_PEER_TIMEOUT naming it and aborts; where it is killed, the job ends.
    Either way the ranks of the first host, waiting for it in MPI, do not hang: the job ends
    with an error within seconds on both hosts and no rank is left running."""
    launch.require(comm)
    bound = 2.0
    t0 = time.monotonic()
    where = "exchange" if how == "stopped" else "kill"
    report = tmp_path / "report.txt"
    r = run_two_hosts(4, [sys.executable, os.path.join(HERE, "peer_worker.py"), where, "3"],
                      env={"PYSHARD_PEER_TIMEOUT": str(bound), "PEER_WORKER_REPORT": str(report)},
                      timeout=90)  # fmt: skip
    took = time.monotonic() - t0
    out = f"exit status {r.returncode} after {took:.1f} s\n{r.stdout}{r.stderr}"
    assert r.returncode != 0, out
    assert "finished" not in out, out
    assert "bytes crossed the veth" in out, out  # the script tore the hosts down
    if how == "stopped":
        raised = raised_lines(r.stdout, report)
        assert raised and "on rank 2" in raised[0], out
        assert "PYSHARD_PEER_TIMEOUT" in raised[0] and "rank 3" in raised[0], raised[0]
    assert took < 60, f"the job took {took:.0f} s to end"
    assert left_running("peer_worker.py") == [], "a rank of the job is still running"
