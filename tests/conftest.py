"""pytest under mpiexec: every rank runs the same tests; rank 0 reports.

Ranks other than 0 stay quiet but print their own failures (prefixed with the rank) to
stderr, and at the end every rank agrees on the outcome, so a failure on any rank fails the
run on every rank. A test that makes collective calls may skip by communicator size, never
by rank.

A test that runs past ``PYSHARD_TEST_TIMEOUT_EACH`` seconds (default 180; 0: no limit) under
mpiexec ends the run: each rank prints every thread's stack (faulthandler) and exits, so a
rank that left a loop of collective calls early shows where every rank waits, within that
limit rather than the stage's (scripts/test.sh: 600 s for a whole run).

A test module that ``-m`` leaves out whole (every test in it carries a module marker the
expression excludes, say test_jax.py under ``-m "not jax"``) is not imported at all
(``pytest_ignore_collect`` below): importing jax or torch costs about a second of CPU a rank,
paid by every rank of every run that would then deselect all of it.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import re
import shutil
import sys
import tempfile

import pytest
from mpi4py import MPI

COMM = MPI.COMM_WORLD


_MARK = re.compile(r"pytest\.mark\.([A-Za-z_]\w*)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def pytest_ignore_collect(collection_path, config):
    """True for a test module that ``-m`` deselects whole, so that it is not imported.

    Its tests all carry the markers of its ``pytestmark = ...`` line; a name of the
    expression that line does not give may be on any test, unless it is one of the markers
    pyproject.toml declares (applied only in a test file's text, never by a hook or a
    plugin) and the file never mentions it. The module is left out only when the
    expression is false for every such choice; when anything is in doubt (an expression
    with arguments, pytest's parser not found), it is collected as usual.
    """
    expr = config.option.markexpr
    name = collection_path.name
    if not expr or not (name.startswith("test_") and name.endswith(".py")):
        return None
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser

        compiled = Expression.compile(expr)
        text = collection_path.read_text(encoding="utf-8")
    except Exception:  # anything odd: collect as usual
        return None
    line = re.search(r"^pytestmark\s*=(.*)$", text, re.M)
    if line is None or "(" in expr:
        return None
    own = {m.split(":")[0].strip() for m in config.getini("markers")}
    module = set(_MARK.findall(line.group(1)))
    mentioned = set(_MARK.findall(text))
    free = sorted(
        n for n in set(_NAME.findall(expr)) - {"and", "or", "not"} - module
        if n not in own or n in mentioned
    )
    for values in itertools.product((False, True), repeat=len(free)):
        on = module | {n for n, v in zip(free, values) if v}
        try:
            if compiled.evaluate(lambda n, on=on, **kw: n in on):
                return None  # some test here may be selected
        except Exception:  # an expression this cannot evaluate
            return None
    return True


def pytest_report_header(config):
    lib = MPI.Get_library_version().splitlines()[0].strip()
    return f"MPI: {lib}; rank {COMM.rank} of {COMM.size}"


_OWN_BASETEMP = []
_STDERR = []  # this rank's stderr, duplicated before pytest captures fd 2 during tests


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _STDERR.append(os.fdopen(os.dup(sys.__stderr__.fileno()), "w"))  # noqa: SIM115
    if COMM.size > 1 and not config.option.basetemp:
        # every rank is its own pytest: give each its own tmp_path root, or their cleanups of
        # the shared /tmp/pytest-of-USER race each other
        config.option.basetemp = tempfile.mkdtemp(prefix=f"pyshard-pytest-r{COMM.rank}-")
        _OWN_BASETEMP.append(config.option.basetemp)
    if COMM.rank != 0:
        # quiet: the terminal reporter (created after this hook) writes to /dev/null; this
        # rank's failures still reach stderr (pytest_runtest_logreport below)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def pytest_unconfigure(config):
    faulthandler.cancel_dump_traceback_later()
    while _STDERR:
        _STDERR.pop().close()
    for d in _OWN_BASETEMP:
        shutil.rmtree(d, ignore_errors=True)


def pytest_runtest_logreport(report):
    if COMM.rank != 0 and report.failed:
        sys.stderr.write(f"[rank {COMM.rank}] FAILED {report.nodeid} ({report.when})\n")
        sys.stderr.write(f"[rank {COMM.rank}] {report.longreprtext}\n")
        sys.stderr.flush()


def _each_limit() -> float:
    v = os.environ.get("PYSHARD_TEST_TIMEOUT_EACH", "180")
    try:
        return float(v)
    except ValueError:
        raise pytest.UsageError(f"PYSHARD_TEST_TIMEOUT_EACH must be seconds, got {v!r}") from None


EACH = _each_limit()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # the watchdog spans setup, call and teardown; a test that sets its own
    # (faulthandler.dump_traceback_later) replaces it for the rest of that test
    armed = COMM.size > 1 and EACH > 0
    if armed:
        faulthandler.dump_traceback_later(EACH, exit=True, file=_STDERR[0])
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    # first, before any other plugin's hook can raise on one rank only: every rank must
    # reach these collectives
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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # pytest-mpi skips a test whose keywords include "mpi" unless --with-mpi, and every
    # folder above a test adds its name to them: in a checkout under a folder named "mpi"
    # (say ~/src/mpi/pyshard) it would skip the whole serial suite. Keep its skip only on
    # tests that carry the mpi marker.
    if config.getoption("--with-mpi", default=False):
        return
    theirs = "need --with-mpi option to run"
    for item in items:
        if item.get_closest_marker("mpi") is None:
            item.own_markers = [
                m for m in item.own_markers
                if not (m.name == "skip" and m.kwargs.get("reason") == theirs)
            ]  # fmt: skip
