"""A rank that raises between two redistributes ends the whole job with its message when the
job runs under `python -m mpi4py` (MPI_Abort on an unhandled exception), as the demo, the
bench and the Slurm scripts do: mpiexec exits non-zero within seconds, no rank left waiting.
A rank that stops where a node peer waits for it in node-shared memory makes that peer raise
at PYSHARD_PEER_TIMEOUT."""

from __future__ import annotations

import os
import sys
import time

import launch
import pytest

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_a_raising_rank_aborts_the_job(comm):
    launch.require(comm)
    t0 = time.monotonic()
    r = launch.run(3, [sys.executable, "-m", "mpi4py", os.path.join(HERE, "fault_worker.py")])
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 1 gave up between two redistributes" in out, out
    assert "unreachable" not in out, out
    assert took < 60, f"the job took {took:.0f} s to end"
    assert left_running("peer_worker.py") == [], "a rank of the job is still running"


def raised_lines(stdout, report):
    """The "RAISED ..." lines a peer_worker.py job printed, or failing that wrote to ``report``
    (a Path): the launcher may end an aborting job before forwarding its last output."""
    lines = [line for line in stdout.splitlines() if line.startswith("RAISED")]
    if not lines and report.exists():
        lines = [line for line in report.read_text().splitlines() if line.startswith("RAISED")]
    return lines


def left_running(script):
    """Pids of processes whose command line names ``script`` (Linux /proc)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if script.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
@pytest.mark.parametrize("where", [
    # numerics: pyshard's own waits on node-shared memory, the same on every MPI library; the
    # matrix's 1-rank run keeps one of them (exchange) and the wait on an MPI request (validate)
    pytest.param("setup", marks=pytest.mark.numerics),
    "exchange",
    pytest.param("arrive", marks=pytest.mark.numerics),
    pytest.param("halo", marks=pytest.mark.numerics),
    "validate",
])
def test_a_stopped_node_peer_makes_the_waiting_rank_raise(comm, where, tmp_path):
    """Rank 1 stops at mesh setup, before a node-shared exchange, inside one (after its writes,
    before its arrivals) or before a halo update, or
    before a redistribute in the validation mode (its check, a collective, waited for ever);
    rank 0's wait for it ends at PYSHARD_PEER_TIMEOUT with a RuntimeError naming the rank and
    what it waited for (instead of hanging), and the job is torn down: no process is left
    (launch.run waits for the job's session to empty and removes MPI's segments)."""
    launch.require(comm)
    bound = 2.0
    t0 = time.monotonic()
    report = tmp_path / "report.txt"
    env = {"PYSHARD_PEER_TIMEOUT": str(bound), "PEER_WORKER_REPORT": str(report)}
    args = [sys.executable, os.path.join(HERE, "peer_worker.py"), where]
    r = launch.run(2, args, env=env, timeout=90)
    if r.returncode != 0 and not (r.stdout or r.stderr or report.exists()):
        # a job that said nothing at all, on no stream and in no file, tells nothing about
        # pyshard (its launcher failed); run it once more, and show both exits if it fails
        first = f"first try: exit status {r.returncode} after {time.monotonic() - t0:.1f} s\n"
        t0 = time.monotonic()
        r = launch.run(2, args, env=env, timeout=90)
        r.stderr = first + r.stderr
    took = time.monotonic() - t0
    out = f"exit status {r.returncode} after {took:.1f} s\n{r.stdout}{r.stderr}"
    assert r.returncode != 0, out
    assert "finished" not in out, out
    raised = raised_lines(r.stdout, report)
    assert raised and "on rank 0" in raised[0], out
    msg = raised[0]
    assert "PYSHARD_PEER_TIMEOUT" in msg, msg
    if where == "validate":  # (an Iallgather: which rank is missing is not known)
        assert "validation mode" in msg and "not in this call" in msg, msg
    else:
        assert "rank 1" in msg, msg
    if where == "arrive":  # its wait for arrivals, naming the rank that has not arrived
        assert "rank 1 of this communicator to finish writing" in msg, msg
    waited = float(msg.split("after ")[1].split(" s")[0])
    assert bound <= waited < bound + 10, msg  # within the bound, not the sleep's 120 s
    assert took < 60, f"the job took {took:.0f} s to end"
    assert left_running("peer_worker.py") == [], "a rank of the job is still running"



@pytest.mark.spawns
def test_a_stopped_peer_of_a_mesh_dim_is_named_by_its_world_rank(comm, tmp_path):
    """On a 2x2 mesh, world rank 3 stops before an exchange along mesh dim 1: world rank 2's
    error names it as that dim's rank 1 and as world rank 3 (it named "rank 1 of this
    communicator" alone, which is world rank 1 to a reader of the job's output)."""
    launch.require(comm)
    report = tmp_path / "report.txt"
    env = {"PYSHARD_PEER_TIMEOUT": "2", "PEER_WORKER_REPORT": str(report)}
    r = launch.run(4, [sys.executable, os.path.join(HERE, "peer_worker.py"), "dim", "3"],
                   env=env, timeout=90)
    out = f"exit status {r.returncode}\n{r.stdout}{r.stderr}"
    raised = raised_lines(r.stdout, report)
    assert r.returncode != 0 and raised, out
    msg = raised[0]
    assert "on rank 2" in msg and "rank 1 of this communicator (world rank 3)" in msg, msg
    assert left_running("peer_worker.py") == [], "a rank of the job is still running"


@pytest.mark.spawns
def test_calls_after_finalize_raise(comm, tmp_path):
    """After MPI.Finalize(), every kind of pyshard call raises RuntimeError naming it (MPICH
    ended the process with its own message from a repeated redistribute, an FFT plan,
    redistribute_many, migrate, save, load and Mesh(); then from the wait() and test() of
    handles started before it, Mesh.free() and build_info(); then from a new gather plan,
    take, scatter_add, balance, and validation's agreement, which ran first)."""
    launch.require(comm)
    r = launch.run(2, [sys.executable, os.path.join(HERE, "finalize_worker.py")],
                   timeout=90, cwd=str(tmp_path))
    lines = [x for q in range(2) if (tmp_path / f"report-{q}.txt").exists()
             for x in (tmp_path / f"report-{q}.txt").read_text().splitlines()]
    out = f"exit status {r.returncode}\n{r.stdout}{r.stderr}\n" + "\n".join(lines)
    assert r.returncode == 0 and lines.count("done") == 2, out
    assert not [x for x in lines if x.startswith("WRONG")], out
    assert sum(x.startswith("RAISED") for x in lines) == 2 * 28, out
