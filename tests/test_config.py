"""pyshard.config: every PYSHARD_* setting parsed in one place, one error style, settable from
Python, the docs table generated from it, and no other module reading the environment."""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np
import pytest

import pyshard as ps
from pyshard import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_defaults_and_environment(monkeypatch):
    for name, s in config.SETTINGS.items():
        monkeypatch.delenv(name, raising=False)
        assert config.get(name) == s.default, name
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", " 4096 ")
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 4096
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "0")  # read again when it changes
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
    monkeypatch.setenv("PYSHARD_TRANSPORT", "MPI")
    assert config.get("PYSHARD_TRANSPORT") == "mpi"
    monkeypatch.setenv("PYSHARD_VALIDATE", "on")
    assert config.get("PYSHARD_VALIDATE") is True


@pytest.mark.parametrize(
    "name,raw,accepts",
    [
        ("PYSHARD_SHM_MIN_BYTES", "-1", "an integer >= 0 (below 2^63)"),
        ("PYSHARD_SHM_MIN_BYTES", "16k", "an integer >= 0 (below 2^63)"),
        ("PYSHARD_NODE_SIZE", "0", "an integer >= 1 (below 2^63)"),
        ("PYSHARD_COUNT_LIMIT", "7", "an integer in [8, 2^31-1]"),
        ("PYSHARD_VALIDATE", "maybe", "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_CUDA_AWARE", "2", "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_TRANSPORT", "fast", "auto, shm, mpi, direct or staged"),
        ("PYSHARD_SHM", "on", "auto or off"),
        ("PYSHARD_MPI_TRANSPORT", "mpi", "auto, direct or staged"),
        ("PYSHARD_PEER_TIMEOUT", "0", "a finite number of seconds > 0"),
        ("PYSHARD_PEER_TIMEOUT", "inf", "a finite number of seconds > 0"),
        ("PYSHARD_HALO_METHOD", "mail",
         "one of auto, shm, persistent, p2p, datatype, neighbor, tune"),
    ],
)
def test_one_error_style(monkeypatch, name, raw, accepts):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}, got {raw!r}")):
        config.get(name)
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}, got {raw!r}")):
        config.set(name, raw)


def test_python_settings_win_and_are_restored(monkeypatch):
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "100")
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0, PYSHARD_TRANSPORT="mpi"):
        assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
        assert config.get("PYSHARD_TRANSPORT") == "mpi"
        with ps.config.override(PYSHARD_SHM_MIN_BYTES="7"):  # strings parse as the env's
            assert config.get("PYSHARD_SHM_MIN_BYTES") == 7
        assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 100
    config.set("PYSHARD_SHM_MIN_BYTES", None)  # the default, whatever the environment says
    assert config.get("PYSHARD_SHM_MIN_BYTES") is None
    config.reset("PYSHARD_SHM_MIN_BYTES")
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 100
    with pytest.raises(KeyError, match="no setting named 'PYSHARD_FASTER'"):
        config.get("PYSHARD_FASTER")


def test_docs_table_is_generated_from_the_settings():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        doc = f.read()
    assert config.table() in doc, "regenerate: python -m pyshard config > docs/configuration.md"


def test_no_other_module_reads_a_setting():
    """The environment's PYSHARD_* variables are read by pyshard/config.py alone."""
    found = []
    for top, _, files in os.walk(os.path.join(ROOT, "pyshard")):
        for f in files:
            if not f.endswith(".py") or f == "config.py" and top.endswith("pyshard"):
                continue
            path = os.path.join(top, f)
            with open(path) as fh:
                for n, line in enumerate(fh, 1):
                    if re.search(r"(environ|getenv)\b.*PYSHARD_", line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "name,value,accepts",
    [
        ("PYSHARD_CACHE_LIMIT", 0, "an integer >= 1 (below 2^63)"),  # (set_cache_limit(0) too)
        ("PYSHARD_CACHE_LIMIT", 2.5, "an integer >= 1 (below 2^63)"),
        ("PYSHARD_CACHE_LIMIT", True, "an integer >= 1 (below 2^63)"),  # a bool is no count
        ("PYSHARD_SHM_MIN_BYTES", 2**63, "an integer >= 0 (below 2^63)"),  # (said no bound)
        ("PYSHARD_SHM_MIN_BYTES", -1, "an integer >= 0 (below 2^63)"),
        ("PYSHARD_COUNT_LIMIT", 7, "an integer in [8, 2^31-1]"),
        ("PYSHARD_COUNT_LIMIT", 1 << 31, "an integer in [8, 2^31-1]"),
        ("PYSHARD_RESULT_POOL_BYTES", -1, "an integer >= 0 (below 2^63)"),
        ("PYSHARD_MANY_BATCH_BYTES", 0, "an integer >= 1 (below 2^63)"),
        ("PYSHARD_VALIDATE", 2, "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_VALIDATE", "maybe", "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_PEER_TIMEOUT", 0, "a finite number of seconds > 0"),
        ("PYSHARD_PEER_TIMEOUT", float("nan"), "a finite number of seconds > 0"),
        ("PYSHARD_PEER_TIMEOUT", True, "a finite number of seconds > 0"),
        ("PYSHARD_ALGORITHM", 3, "one of auto, tune, alltoallv"),
        ("PYSHARD_SHM", False, "auto or off"),
        ("PYSHARD_TUNE_FILE", 5, "a file path"),
    ],
)
def test_every_value_is_parsed_whatever_its_type(name, value, accepts):
    """config.set and override check a Python value as the environment's string would be
    checked: one the setting cannot take raises, naming both, and nothing changes."""
    before = config.get(name)
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}")) as e:
        config.set(name, value)
    assert f"got {value!r}" in str(e.value)
    assert config.get(name) == before
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}")):
        with config.override(PYSHARD_LOAD_DIRECT_BYTES=5, **{name: value}):
            pass
    assert config.get("PYSHARD_LOAD_DIRECT_BYTES") != 5  # override checks all, then sets


def test_python_values_of_every_type_are_taken():
    with config.override(PYSHARD_CACHE_LIMIT=np.int64(7), PYSHARD_PEER_TIMEOUT=2,
                         PYSHARD_VALIDATE=1, PYSHARD_TUNE_FILE=pathlib.Path("/tmp/t"),
                         PYSHARD_SHM="OFF"):  # fmt: skip
        assert config.get("PYSHARD_CACHE_LIMIT") == 7
        assert type(config.get("PYSHARD_CACHE_LIMIT")) is int
        assert config.get("PYSHARD_PEER_TIMEOUT") == 2.0
        assert config.get("PYSHARD_VALIDATE") is True
        assert config.get("PYSHARD_TUNE_FILE") == "/tmp/t"
        assert config.get("PYSHARD_SHM") == "off"
    with config.override(PYSHARD_VALIDATE=np.True_):  # (numpy's bool: refused before)
        assert config.get("PYSHARD_VALIDATE") is True
    with config.override(PYSHARD_VALIDATE=np.False_):
        assert config.get("PYSHARD_VALIDATE") is False


@pytest.mark.parametrize("old", sorted(config.TRANSPORT_SPELLINGS))
def test_the_older_transport_spelling_decides_the_two_settings(monkeypatch, old):
    """PYSHARD_TRANSPORT maps onto PYSHARD_SHM and PYSHARD_MPI_TRANSPORT where those are not
    set, from the environment or from Python; either, where set, wins."""
    for n in ("PYSHARD_SHM", "PYSHARD_MPI_TRANSPORT", "PYSHARD_TRANSPORT"):
        monkeypatch.delenv(n, raising=False)
    shm, mpi = config.TRANSPORT_SPELLINGS[old]
    monkeypatch.setenv("PYSHARD_TRANSPORT", old)
    assert (config.get("PYSHARD_SHM"), config.get("PYSHARD_MPI_TRANSPORT")) == (shm, mpi)
    with config.override(PYSHARD_TRANSPORT="auto"):
        assert config.get("PYSHARD_SHM") == "auto"
        assert config.get("PYSHARD_MPI_TRANSPORT") == "auto"
    with config.override(PYSHARD_TRANSPORT=old):
        assert (config.get("PYSHARD_SHM"), config.get("PYSHARD_MPI_TRANSPORT")) == (shm, mpi)
        with config.override(PYSHARD_SHM="auto"):
            assert config.get("PYSHARD_SHM") == "auto"
            assert config.get("PYSHARD_MPI_TRANSPORT") == mpi
    monkeypatch.setenv("PYSHARD_MPI_TRANSPORT", "staged")
    assert config.get("PYSHARD_MPI_TRANSPORT") == "staged"
    assert config.get("PYSHARD_SHM") == shm
    monkeypatch.setenv("PYSHARD_SHM", "auto")
    assert config.get("PYSHARD_SHM") == "auto"


def test_none_is_the_value_of_an_unset_variable_for_every_setting(monkeypatch):
    """set(NAME, None) and override(NAME=None) give every setting the value it has where its
    variable is not set, whatever the environment says: its default, and for PYSHARD_SHM and
    PYSHARD_MPI_TRANSPORT what PYSHARD_TRANSPORT says (not a pinned 'auto'), as it changes."""
    for name in config.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYSHARD_TRANSPORT", "direct")
    unset = {name: config.get(name) for name in config.SETTINGS}
    assert unset["PYSHARD_SHM"] == "off" and unset["PYSHARD_MPI_TRANSPORT"] == "direct"
    monkeypatch.setenv("PYSHARD_SHM", "auto")  # their own variables: not what None restores
    monkeypatch.setenv("PYSHARD_MPI_TRANSPORT", "staged")
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "100")
    try:
        for name in config.SETTINGS:
            if name == "PYSHARD_TRANSPORT":
                continue
            config.set(name, None)
            assert config.get(name) == unset[name], name
            config.reset(name)
            with config.override(**{name: None}):
                assert config.get(name) == unset[name], name
        config.set("PYSHARD_SHM", None)
        config.set("PYSHARD_MPI_TRANSPORT", None)
        monkeypatch.setenv("PYSHARD_TRANSPORT", "mpi")  # followed, as where they are unset
        assert (config.get("PYSHARD_SHM"), config.get("PYSHARD_MPI_TRANSPORT")) == ("off", "auto")
        with config.override(PYSHARD_TRANSPORT="staged"):
            assert config.get("PYSHARD_MPI_TRANSPORT") == "staged"
        config.reset("PYSHARD_SHM")  # reset: back to the environment's
        assert config.get("PYSHARD_SHM") == "auto"
    finally:
        config.reset("PYSHARD_SHM")
        config.reset("PYSHARD_MPI_TRANSPORT")


@pytest.mark.parametrize("newer", ["env", "python", "one in env", "none"])
def test_a_bad_older_transport_raises_whether_or_not_it_decides(monkeypatch, newer):
    """A bad PYSHARD_TRANSPORT raises the one error at every read of the two it spells, where
    they are set (environment or Python) as where they are not: never silently ignored."""
    for n in ("PYSHARD_SHM", "PYSHARD_MPI_TRANSPORT"):
        monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv("PYSHARD_TRANSPORT", "fast")
    if newer == "env":
        monkeypatch.setenv("PYSHARD_SHM", "auto")
        monkeypatch.setenv("PYSHARD_MPI_TRANSPORT", "auto")
    elif newer == "one in env":
        monkeypatch.setenv("PYSHARD_SHM", "off")
    pinned = {"PYSHARD_SHM": "auto", "PYSHARD_MPI_TRANSPORT": "staged"} if newer == "python" else {}
    error = re.escape("PYSHARD_TRANSPORT must be auto, shm, mpi, direct or staged, got 'fast'")
    with config.override(**pinned):
        for n in ("PYSHARD_TRANSPORT", "PYSHARD_SHM", "PYSHARD_MPI_TRANSPORT"):
            with pytest.raises(ValueError, match=error):
                config.get(n)
    monkeypatch.setenv("PYSHARD_TRANSPORT", "mpi")  # fixed: read again
    with config.override(**pinned):
        assert config.get("PYSHARD_SHM") in ("auto", "off")


def test_the_spelling_table_in_the_docs_is_the_code_s():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        doc = f.read()
    row = r"^\| (`[a-z]+`(?: \(default\))?(?:, `[a-z]+`)*) \| `([a-z]+)` \| `([a-z]+)` \|$"
    rows = re.findall(row, doc, re.M)
    got = {}
    for olds, shm, mpi in rows:
        for old in re.findall(r"`([a-z]+)`", olds):
            got[old] = (shm, mpi)
    assert got == config.TRANSPORT_SPELLINGS


def test_applied_settings_follow_every_change(monkeypatch):
    """apply_with: the function runs at once, then at each change of the value (set, reset,
    override and its end, a changed variable read by refresh), and not where it stays."""
    monkeypatch.delenv("PYSHARD_LOAD_DIRECT_BYTES", raising=False)
    seen = []
    fn = seen.append
    config.apply_with("PYSHARD_LOAD_DIRECT_BYTES", fn)
    try:
        assert seen == [4096]
        config.set("PYSHARD_LOAD_DIRECT_BYTES", "10")
        config.set("PYSHARD_LOAD_DIRECT_BYTES", 10)  # the same value: not applied again
        with config.override(PYSHARD_LOAD_DIRECT_BYTES=0):
            assert seen == [4096, 10, 0]
        assert seen == [4096, 10, 0, 10]
        config.reset("PYSHARD_LOAD_DIRECT_BYTES")
        monkeypatch.setenv("PYSHARD_LOAD_DIRECT_BYTES", "3")
        config.refresh()
        assert seen == [4096, 10, 0, 10, 4096, 3]
        config.apply_with("PYSHARD_LOAD_DIRECT_BYTES", fn)  # registered once, applied again
        config.set("PYSHARD_LOAD_DIRECT_BYTES", 9)
        assert seen == [4096, 10, 0, 10, 4096, 3, 3, 9]
    finally:  # (fn stays registered: it only appends to this test's list)
        config.reset("PYSHARD_LOAD_DIRECT_BYTES")


def test_refresh_applies_every_change_before_it_raises(monkeypatch):
    """refresh() with one refused value among changed ones: the others are applied, the
    refused one holds its default and is raised by the next Mesh, and once fixed a refresh
    applies it (a refused value left the settings after it unapplied for good, and a fixed
    one too: validation read on while the process ran without it)."""
    from mpi4py import MPI

    seen = []
    monkeypatch.delenv("PYSHARD_LOAD_DIRECT_BYTES", raising=False)
    config.apply_with("PYSHARD_LOAD_DIRECT_BYTES", seen.append)
    monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "256")
    config.refresh()
    try:
        monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "0")  # refused, and read first
        monkeypatch.setenv("PYSHARD_LOAD_DIRECT_BYTES", "5")
        with pytest.raises(ValueError, match="PYSHARD_CACHE_LIMIT"):
            config.refresh()
        assert seen[-1] == 5 and ps.cache_limit() == 256
        with pytest.raises(ValueError, match="PYSHARD_CACHE_LIMIT"):
            ps.Mesh(MPI.COMM_SELF, (1,))
        monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "64")
        config.refresh()
        assert ps.cache_limit() == 64 and config.get("PYSHARD_CACHE_LIMIT") == 64
        ps.Mesh(MPI.COMM_SELF, (1,)).free()
    finally:
        monkeypatch.delenv("PYSHARD_CACHE_LIMIT")
        monkeypatch.delenv("PYSHARD_LOAD_DIRECT_BYTES")
        config.refresh()
    assert ps.cache_limit() == 256


def test_process_settings_are_applied_at_once():
    """Without any call: the cache limit, the validation mode, the count limit and the peer
    timeout the process holds follow the settings as soon as they change."""
    with config.override(PYSHARD_CACHE_LIMIT=3, PYSHARD_VALIDATE=True,
                         PYSHARD_COUNT_LIMIT=64, PYSHARD_PEER_TIMEOUT=7.5):  # fmt: skip
        assert ps.cache_limit() == 3
        assert ps.validation() is True
        info = ps.build_info()
        assert (info["count_limit"], info["peer_timeout"]) == (64, 7.5)
        ps.set_validation(False)  # config.set: the setting and the mode, one value
        assert ps.validation() is False and config.get("PYSHARD_VALIDATE") is False
        config.set("PYSHARD_VALIDATE", True)  # and config.set turns it back on (it did not)
        assert ps.validation() is True
        ps.set_cache_limit(5)
        assert config.get("PYSHARD_CACHE_LIMIT") == 5 and ps.cache_limit() == 5
        config.set("PYSHARD_CACHE_LIMIT", 3)
        assert ps.cache_limit() == 3
        with config.override(PYSHARD_VALIDATE=False), config.override(PYSHARD_VALIDATE=True):
            assert ps.validation() is True
    info = ps.build_info()
    assert (info["count_limit"], info["peer_timeout"]) == (
        config.get("PYSHARD_COUNT_LIMIT") or (1 << 31) - 1, config.get("PYSHARD_PEER_TIMEOUT"))
    assert ps.cache_limit() == config.get("PYSHARD_CACHE_LIMIT")
    assert ps.validation() is config.get("PYSHARD_VALIDATE")


def test_threads_note():
    """The unbounded-threads warning's rule: ranks sharing a machine, none of the thread
    variables set; the advice divides the cores among the ranks."""
    note = config.threads_note(4, 16, {})
    assert note and "4 ranks share this machine's 16 cores" in note
    assert "Set OMP_NUM_THREADS=4 " in note, note
    assert "Set OMP_NUM_THREADS=1 " in config.threads_note(8, 2, {"OTHER": "x"})
    assert "share this machine and" in config.threads_note(2, 0, {})
    assert config.threads_note(1, 16, {}) is None  # one rank: its threads are its own
    for v in config.THREAD_VARIABLES:
        assert config.threads_note(4, 16, {v: "2"}) is None, v
    assert config.threads_note(4, 16, {"OMP_NUM_THREADS": ""}) is not None  # empty: unset


def test_byte_settings_past_int64_refused_and_left_as_they_were():
    """A byte count past the core's int64 (PYSHARD_RESULT_POOL_BYTES=2**64) is refused as any
    other bad value (pybind11 raised its own TypeError, and the value stayed set)."""
    before = ps.config.get("PYSHARD_RESULT_POOL_BYTES")
    with pytest.raises(ValueError, match="PYSHARD_RESULT_POOL_BYTES must be"):
        ps.config.set("PYSHARD_RESULT_POOL_BYTES", 2**64)
    assert ps.config.get("PYSHARD_RESULT_POOL_BYTES") == before
    ps.config.set("PYSHARD_RESULT_POOL_BYTES", 2**63 - 1)  # the largest taken
    ps.config.reset("PYSHARD_RESULT_POOL_BYTES")
    assert ps.config.get("PYSHARD_RESULT_POOL_BYTES") == before


@pytest.mark.parametrize("args, says", [
    (["--shape", "abc"], "is not a shape"),
    (["--shape", "7"], "is not a shape"),
    (["--dtype", "foo"], "not a numpy dtype"),
    (["--dtype", "U3"], "pyshard moves numeric and bool arrays only"),
    # (a traceback on every rank after the argument checks)
    (["--dtype", "longdouble"], "need a dtype pyshard sums"),
    (["--reps", "0"], "must be an integer >= 1"),
])
def test_demo_arguments_checked(capsys, args, says):
    """``python -m pyshard demo`` checks its arguments as bench does: an argparse error
    (exit 2) naming the option (they gave tracebacks, or times of nan for --reps 0)."""
    from pyshard.__main__ import demo

    with pytest.raises(SystemExit) as e:
        demo(args)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "bool"])
def test_demo_runs_every_dtype_it_takes(capsys, dtype):
    """The demo takes ml_dtypes' floats as bench does (bfloat16 was 'not a numpy dtype'), and
    its sums' reference rounds once, as pyshard's float32 accumulation does."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    from pyshard.__main__ import demo

    assert demo(["--shape", "9x5", "--reps", "1", "--dtype", dtype]) == 0
    assert "all results equal the numpy reference" in capsys.readouterr().out


def test_cli_without_a_command_and_config_with_arguments(capsys):
    """No command: the usage on stderr, exit 2 (it went to stdout); ``config`` with
    arguments says it takes none (they were ignored)."""
    from pyshard.__main__ import main

    assert main([]) == 2
    out = capsys.readouterr()
    assert "usage:" in out.err and out.out == ""
    assert main(["config", "extra"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
    assert main(["config"]) == 0
    assert "PYSHARD_ALGORITHM" in capsys.readouterr().out


def test_a_value_refused_at_the_end_of_an_override_is_raised_by_the_next_mesh(monkeypatch):
    """An applied setting whose environment value is refused where no call can raise it (the
    end of an override; import is tested in tests/mpi/test_doctor.py): the block's end does
    not raise (it did), the process holds the default, and the next Mesh built, and the next
    call on a mesh built before, raise the ValueError; a good value is applied then."""
    from mpi4py import MPI

    mesh = ps.Mesh(MPI.COMM_SELF, (1,))
    x = ps.distribute(np.arange(6.0).reshape(2, 3), mesh, [ps.Shard(0)])
    says = r"PYSHARD_CACHE_LIMIT must be an integer >= 1 \(below 2\^63\), got '0'"
    try:
        with config.override(PYSHARD_CACHE_LIMIT=5):
            monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "0")
        assert ps.cache_limit() == 256  # the default, not 5 nor 0
        with pytest.raises(ValueError, match=says):
            ps.Mesh(MPI.COMM_SELF, (1,))
        with pytest.raises(ValueError, match=says):
            x.redistribute([ps.Shard(1)])
        monkeypatch.setenv("PYSHARD_CACHE_LIMIT", "7")
        y = x.redistribute([ps.Shard(1)])  # good now: applied
        np.testing.assert_array_equal(y.local, np.arange(6.0).reshape(2, 3))
        assert ps.cache_limit() == 7
    finally:
        monkeypatch.delenv("PYSHARD_CACHE_LIMIT")
        config.refresh()
        mesh.free()
    assert ps.cache_limit() == 256


def test_a_bad_older_transport_shows_under_its_own_name():
    """The validation agreement's settings line names the variable that holds a bad value:
    a bad PYSHARD_TRANSPORT showed as PYSHARD_SHM=invalid None, PYSHARD_MPI_TRANSPORT=..."""
    os.environ["PYSHARD_TRANSPORT"] = "bogus"
    try:
        line = config.collective_settings()
    finally:
        del os.environ["PYSHARD_TRANSPORT"]
    assert line == "PYSHARD_TRANSPORT=invalid 'bogus'", line


def test_cli_config_help_and_plot_errors(capsys, tmp_path):
    """``config --help`` says what it prints (exit 0); ``plot`` with a missing file or one
    that is not JSON lines: a message and exit 1 (tracebacks before)."""
    from pyshard.__main__ import main

    assert main(["config", "--help"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m pyshard config") and out.err == ""
    missing = tmp_path / "none.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    pytest.importorskip("matplotlib")
    assert main(["plot", str(missing), "-o", str(tmp_path / "p.png")]) == 1
    assert f"{missing}: No such file or directory" in capsys.readouterr().err
    assert main(["plot", str(bad), "-o", str(tmp_path / "p.png")]) == 1
    assert "a line is not JSON" in capsys.readouterr().err
    # JSON that is no object, bytes that are no text, a format matplotlib does not write,
    # a row without a time: messages (they were tracebacks)
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00\n")
    row = {"case": "transpose", "algorithm": "auto", "ranks": 2, "shape": [8, 8],
           "dtype": "float32", "median_s": 1e-3, "floor_median_s": 5e-4}
    (tmp_path / "none.jsonl").write_text(json.dumps({**row, "median_s": None}) + "\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(row) + "\n")
    for f, says in (("list.jsonl", "line 1 is JSON but not an object"),
                    ("bin.jsonl", "a file is not text")):
        assert main(["plot", str(tmp_path / f), "-o", str(tmp_path / "p.png")]) == 1
        assert says in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "p.png")]) == 1
    assert "1 row(s) without a time" in capsys.readouterr().err
    assert main(["plot", str(good), "-o", str(tmp_path / "p.xyz")]) == 1
    assert "matplotlib writes" in capsys.readouterr().err
    # two runs of other shapes at one rank count: plotted, with a warning
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**row, "ranks": n, "shape": [16, 16]}) + "\n"
                             for n in (2, 3)))
    assert main(["plot", str(good), str(other), "-o", str(tmp_path / "s.png")]) == 0
    assert "transpose auto: one rank count has rows of several shapes" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("args, says", [
    (["--formats", "bogus"], "argument --formats: unknown checkpoint format 'bogus'"),
    (["--formats", "npy,zarr2"], "unknown checkpoint format 'zarr2'"),
    (["--dtype", "object"], "argument --dtype: pyshard moves numeric and bool arrays only"),
    (["--dtype", "U3"], "numeric and bool arrays only"),
    (["--dtype", "foo"], "not a numpy dtype"),
    (["--checkpoint-bytes", "2"], "argument --checkpoint-bytes: must be an integer >= 4"),
    (["--shape", "2x2x2x2x2x2x2x2x2"], "(2-D to 8-D)"),
])
def test_bench_arguments_checked(capsys, args, says):
    """bench refuses a checkpoint format it does not know (ignored without the checkpoint
    case, a traceback with it) and a dtype pyshard does not move (a traceback): argparse
    errors, exit 2."""
    from pyshard.bench.cli import make_parser

    with pytest.raises(SystemExit) as e:
        make_parser().parse_args(args)
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert make_parser().parse_args(["--formats", "all", "--dtype", "bool"]).formats == "all"


def test_bench_refuses_before_any_case(capsys, tmp_path):
    """An --json path that cannot be appended to, and the reduce_scatter case with a dtype
    its MPI reference cannot sum (bool, bfloat16), are argument errors before any case runs
    (the first lost every result at the end, on rank 0 only; the second was a traceback on
    every rank); without naming the case, the default cases leave it out with a note."""
    from pyshard.bench.cli import main

    for args, says in (
        (["--cases", "transpose", "--json", str(tmp_path / "no" / "x.jsonl")],
         "argument --json: cannot append to"),
        (["--cases", "transpose", "--json", str(tmp_path)], "argument --json: cannot append"),
        (["--cases", "transpose,reduce_scatter", "--dtype", "bool"],
         "the reduce_scatter case cannot sum --dtype bool"),
        (["--cases", "reduce_scatter", "--dtype", "longdouble"],
         "the reduce_scatter case cannot sum --dtype longdouble"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["--shape", "8x4", "--reps", "1", "--warmup", "0", *args])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    out = tmp_path / "r.jsonl"
    assert main(["--shape", "8x4", "--reps", "1", "--warmup", "0", "--dtype", "bfloat16",
                 "--json", str(out)]) == 0
    assert "reduce_scatter left out" in capsys.readouterr().err
    cases = [json.loads(line)["case"] for line in out.read_text().splitlines()]
    assert "transpose" in cases and "reduce_scatter" not in cases
