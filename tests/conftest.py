"""pytest under mpiexec: every rank runs the same tests; rank 0 reports.

Ranks other than 0 stay quiet but print their own failures (prefixed with the rank) to
stderr, and at the end every rank agrees on the outcome, so a failure on any rank fails the
run on every rank. A test that makes collective calls may skip by communicator size, never
by rank.
"""

from __future__ import annotations

import sys

import pytest
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def pytest_report_header(config):
    lib = MPI.Get_library_version().splitlines()[0].strip()
    return f"MPI: {lib}; rank {COMM.rank} of {COMM.size}"


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if COMM.rank != 0:
        config.option.verbose = -2
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            config.pluginmanager.unregister(tr)


def pytest_runtest_logreport(report):
    if COMM.rank != 0 and report.failed:
        sys.stderr.write(f"[rank {COMM.rank}] FAILED {report.nodeid} ({report.when})\n")
        sys.stderr.write(f"[rank {COMM.rank}] {report.longreprtext}\n")
        sys.stderr.flush()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if COMM.size == 1:
        return
    bad = COMM.allreduce(int(session.testsfailed), op=MPI.SUM)
    failed_ranks = COMM.gather(int(session.testsfailed), root=0)
    if bad and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if COMM.rank == 0 and bad:
        ranks = [r for r, n in enumerate(failed_ranks) if n]
        sys.stdout.write(f"\npyshard: test failures on MPI ranks {ranks} (see stderr)\n")


@pytest.fixture
def comm():
    return COMM
