"""``python -m pyshard doctor`` (pyshard.doctor.report): every rank in exactly one node's block,
the same report on every rank, and what it says about node-shared memory and cross-memory
attach following what the node transport does (one node, simulated nodes, a rank that cannot
set up, attach refused, attach turned off); the CLI run as a user runs it."""

from __future__ import annotations

import re
import sys

import launch
import numpy as np
import pytest

import pyshard as ps
from pyshard.doctor import rank_facts, report
from pyshard.memory import failing_node_setup

pytestmark = pytest.mark.mpi


def node_blocks(lines):
    """{first rank of the node: (its ranks, the block's lines)} from the report's lines."""
    blocks, cur = {}, None
    for line in lines[1:]:
        m = re.match(r"node \S+: ranks ([0-9, -]+), ", line)
        if m:
            ranks = []
            for part in m.group(1).split(", "):
                a, _, b = part.partition("-")
                ranks += list(range(int(a), int(b or a) + 1))
            cur = ranks[0]
            blocks[cur] = (ranks, [])
        elif cur is not None and line.startswith("  "):
            blocks[cur][1].append(line.strip())
    return blocks


def report_under(comm, monkeypatch):
    """report(comm) under the environment monkeypatch set, which is then undone."""
    ps.config.refresh()
    try:
        return report(comm)
    finally:
        monkeypatch.undo()
        ps.config.refresh()


def transport(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    node = mesh.node_transport((0,))
    cma = bool(node is not None and node.cma)
    groups = mesh.node_groups((0,))
    mesh.free()
    return node is not None, cma, groups


def shm_on(comm):
    """(rank 0's node has node-shared memory, and the settings leave it on; its attach; one
    node holds every rank), decided alike on every rank (a rank skipping alone would leave
    the others in report's collectives). The run's own settings (PYSHARD_TRANSPORT=mpi, the
    simulated nodes) change what doctor reports, so tests that expect a node-shared report
    skip there."""
    shm, cma, groups = transport(comm)
    on = shm and ps.config.get("PYSHARD_SHM") != "off"
    one = bool(groups) and len(set(groups.values())) == 1  # (one rank: no node map, None)
    return comm.bcast((on, cma, one), root=0)


def same_everywhere(comm, lines, hints):
    assert comm.allgather((lines, hints)) == [(lines, hints)] * comm.size


@pytest.mark.parametrize("node_size", [0, 2])
def test_every_rank_in_one_node_block(comm, monkeypatch, node_size):
    """The header counts the ranks and nodes; each rank is in exactly one node's block, with
    the ranks the mesh's node groups put together; node-shared memory and attach as the node
    transport says."""
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    shm, cma, groups = transport(comm)
    every = comm.allgather((shm, cma))  # what each rank's node transport does
    lines, hints = report(comm)
    same_everywhere(comm, lines, hints)
    blocks = node_blocks(lines)
    nodes = len(set(groups.values())) if groups else 1
    assert lines[0].startswith(f"pyshard {ps.__version__}: {comm.size} rank(s) on {nodes} node")
    assert sorted(r for rs, _ in blocks.values() for r in rs) == list(range(comm.size))
    for rs, body in blocks.values():
        if groups:
            assert {groups[r] for r in rs} == {groups[rs[0]]}
        if len(rs) == 1:
            assert "node-shared memory: none needed (one rank on this node)" in body
            continue
        # (set up, and not turned off: PYSHARD_SHM=off is "off" whatever the transport does)
        shm_here = all(every[r][0] for r in rs) and ps.config.get("PYSHARD_SHM") == "auto"
        assert ("node-shared memory: usable" in body) == shm_here, (rs, body)
        if shm_here:
            attach = [b for b in body if b.startswith("node peers write into")]
            assert len(attach) == 1, body
            assert attach[0].endswith(": yes") == all(every[r][1] for r in rs), (rs, attach)


def test_a_rank_that_cannot_set_up(comm):
    """Rank 0 cannot make its control segment: every rank's report says node-shared memory
    is not usable and names rank 0."""
    if comm.size < 2 or not shm_on(comm)[0]:
        pytest.skip("needs two ranks, and node-shared memory not turned off")
    with failing_node_setup("segment" if comm.rank == 0 else None):
        lines, hints = report(comm)
    same_everywhere(comm, lines, hints)
    body = node_blocks(lines)[0][1]
    assert "node-shared memory: not usable (ranks 0 could not set it up): exchanges by MPI" in body


def test_settings_that_differ_or_are_bad_on_one_rank(comm, monkeypatch):
    """The last rank's environment holds an invalid PYSHARD_ALGORITHM (which raised there,
    before the gather: the others waited) and another PYSHARD_SHM_MIN_BYTES: every rank
    gets the same report, naming both; and not the settings that may differ between ranks
    (a timeout, a cache size: they were named too, "every rank must see the same")."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    if comm.rank == comm.size - 1:
        monkeypatch.setenv("PYSHARD_ALGORITHM", "bogus")
        monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "12345")  # (CI runs some jobs with 0)
        monkeypatch.setenv("PYSHARD_PEER_TIMEOUT", "123")  # (these may differ: not named)
        monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "77")
    lines, hints = report_under(comm, monkeypatch)
    same_everywhere(comm, lines, hints)
    who = f"rank {comm.size - 1}"  # one rank differs
    assert any(h.startswith(f"{who} has other settings than rank 0 (PYSHARD_ALGORITHM, "
                            f"PYSHARD_SHM_MIN_BYTES)") for h in hints), hints
    assert any(h.startswith("settings with a value pyshard refuses: PYSHARD_ALGORITHM (the "
                            "first call that reads one raises") for h in hints), hints


@pytest.mark.parametrize("env, says", [
    ({"PYSHARD_SHM": "bogus"}, "PYSHARD_SHM has a value pyshard refuses on ranks "),
    ({"PYSHARD_TRANSPORT": "bogus"}, "PYSHARD_TRANSPORT has a value pyshard refuses on ranks "),
    ({"PYSHARD_TRANSPORT": "mpi"}, "off on ranks "),
])
def test_node_shared_memory_refused_or_off(comm, monkeypatch, env, says):
    """PYSHARD_SHM (or the older PYSHARD_TRANSPORT) refused or off on every rank: the node's
    block says so, not "usable" (the transport is set up all the same, on the default the
    doctor's mesh takes for a refused value; a bad PYSHARD_TRANSPORT crashed the report)."""
    shm = comm.bcast(transport(comm)[0], root=0)  # decided alike on every rank
    if comm.size < 2 or not shm:
        pytest.skip("needs ranks that share node-shared memory")
    monkeypatch.delenv("PYSHARD_SHM", raising=False)  # (PYSHARD_TRANSPORT decides)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    lines, hints = report_under(comm, monkeypatch)
    same_everywhere(comm, lines, hints)
    body = node_blocks(lines)[0][1]
    state = [b for b in body if b.startswith("node-shared memory: ")]
    assert state and state[0].startswith(f"node-shared memory: {says}"), body
    assert not any(b.startswith("node peers write into") for b in body), body
    if "bogus" in env.values():  # named under the variable that holds it, and only that
        name = next(iter(env))
        assert f"settings with a value pyshard refuses: {name} (" in " ".join(hints), hints


def test_node_size_differing_on_one_rank(comm, monkeypatch):
    """The last rank splits the node otherwise (PYSHARD_NODE_SIZE=1): rank 0's block says the
    ranks group the node differently (it blamed PYSHARD_SHM and PYSHARD_TRANSPORT), and the
    hint names PYSHARD_NODE_SIZE."""
    shm, _, one_node = shm_on(comm)
    if comm.size < 2 or not shm or not one_node:
        pytest.skip("needs ranks that share node-shared memory, on one node")
    if comm.rank == comm.size - 1:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", "1")
        ps.config.refresh()
    try:
        lines, hints = report(comm)  # (each rank groups the nodes its own way: rank 0 prints)
    finally:
        monkeypatch.undo()
        ps.config.refresh()
    if comm.rank == 0:
        body = node_blocks(lines)[0][1]
        assert "node-shared memory: not used: the ranks see different PYSHARD_NODE_SIZE, so " \
            "they group the node differently: exchanges by MPI" in body, body
        assert any("other settings than rank 0 (PYSHARD_NODE_SIZE)" in h for h in hints), hints


def test_values_refused_at_import(comm):
    """Settings read at import with values pyshard refuses (``import pyshard`` raised, and
    with it ``doctor`` and ``config``): the import, ``config`` and ``doctor`` work, doctor
    names each; the first Mesh raises each one's ValueError until it is fixed."""
    launch.require(comm)
    bad = {"PYSHARD_CACHE_LIMIT": "0", "PYSHARD_CMA": "maybe", "PYSHARD_VALIDATE": "2",
           "PYSHARD_MANY_BATCH_BYTES": "0", "PYSHARD_POOL_MIN_BYTES": "-1",
           "PYSHARD_RESULT_POOL_BYTES": str(2**64), "PYSHARD_PEER_TIMEOUT": "-1",
           "PYSHARD_COUNT_LIMIT": "1"}
    script = (
        "import sys\n"
        "from mpi4py import MPI\n"
        "import pyshard as ps\n"
        "from pyshard.__main__ import main\n"
        "assert main(['config']) == 0 and main(['doctor']) == 0\n"
        "assert ps.cache_limit() == 256 and not ps.validation()  # the defaults meanwhile\n"
        "for _ in range(len(sys.argv)):\n"
        "    try:\n"
        "        ps.Mesh(MPI.COMM_WORLD, (1,)).free()\n"
        "        print('built', flush=True)\n"
        "        break\n"
        "    except ValueError as e:\n"
        "        print('raised:', e, flush=True)\n"
        "        ps.config.set(str(e).split()[0], None)\n"
    )
    r = launch.run(1, [sys.executable, "-c", script, *bad], env={"OMP_NUM_THREADS": "1", **bad})
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    hint = [line for line in out.splitlines() if "settings with a value pyshard refuses" in line]
    assert hint and all(name in hint[0] for name in bad), out
    raised = re.findall(r"^raised: (\w+) must be .*, got '(.*)'$", out, re.M)
    assert sorted(raised) == sorted(bad.items()), out
    assert out.rstrip().endswith("built"), out


def test_attach_refused_and_turned_off(comm):
    """Attach refused on every rank (as where the kernel says no): 'no', with a hint that
    names the fix; turned off by PYSHARD_CMA=0: the setting is listed and the ranks named."""
    # what rank 0's node does (the block checked below), decided alike on every rank: a rank
    # alone on its node (simulated nodes 2, 2, 1) has no node transport, and skipping on its
    # own would leave the others in report's collective (a hang at 5 ranks)
    shm, cma, _ = shm_on(comm)
    if comm.size < 2 or not shm:
        pytest.skip("needs ranks that share node-shared memory")
    with failing_node_setup("cma"):
        lines, hints = report(comm)
    same_everywhere(comm, lines, hints)
    attach = [b for b in node_blocks(lines)[0][1] if b.startswith("node peers write into")]
    assert attach and ": no (" in attach[0], attach
    assert any("cannot write into each other's memory" in h or "ptrace_scope" in h
               for h in hints), hints
    if not cma:
        return
    with ps.config.override(PYSHARD_CMA=False):
        lines, hints = report(comm)
    same_everywhere(comm, lines, hints)
    assert any(line.startswith("settings that differ") and "PYSHARD_CMA=False" in line
               for line in lines), lines
    attach = [b for b in node_blocks(lines)[0][1] if b.startswith("node peers write into")]
    assert attach and "turned it off (PYSHARD_CMA=0)" in attach[0], attach


@pytest.mark.parametrize("setting", ["never", "advise"])
def test_shared_huge_pages_hint(comm, monkeypatch, setting):
    """Where shared memory gets no huge pages (shmem_enabled never) and ranks share node-shared
    memory, a hint names the setting that gives them; with advise, none."""
    import pyshard.doctor as doctor

    shm = shm_on(comm)[0]  # decided alike on every rank
    if comm.size < 2 or not shm:
        pytest.skip("needs ranks that share node-shared memory")
    facts = doctor.rank_facts
    monkeypatch.setattr(doctor, "rank_facts", lambda: {**facts(), "thp_shmem": setting})
    lines, hints = report(comm)
    same_everywhere(comm, lines, hints)
    hinted = [h for h in hints if "shared memory gets no huge pages" in h]
    assert bool(hinted) == (setting == "never"), hints
    assert all("shmem_enabled to advise" in h for h in hinted)
    assert any(f"{setting} (shared)" in b for b in node_blocks(lines)[0][1])


def test_rank_facts():
    """What a rank reports of itself, with no MPI call: its CPUs, its malloc, the thread
    variables set, and the settings off their defaults."""
    with ps.config.override(PYSHARD_CMA=False):
        f = rank_facts()
    assert len(f["cpus"]) >= 1 and f["malloc"] in ("glibc", "tcmalloc", "jemalloc", "other")
    assert f["settings"].get("PYSHARD_CMA") is False
    assert "PYSHARD_CMA" not in rank_facts()["settings"]
    assert isinstance(f["threads"], dict) and f["mpi"] == f["core_mpi"]
    assert f["ptrace_scope"] is None or f["ptrace_scope"] in range(4)


def test_cli(comm):
    """``mpiexec -n 2 python -m pyshard doctor`` as a user runs it: exit 0, the report on
    rank 0 only, a hints list."""
    launch.require(comm)
    r = launch.run(2, [sys.executable, "-m", "pyshard", "doctor"],
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.count("pyshard ") >= 1 and out.count(": 2 rank(s) on ") == 1, out
    assert re.search(r"^hints:", out, re.M), out
    assert np.all([not line.startswith("Traceback") for line in out.splitlines()])
