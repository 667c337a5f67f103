"""pyshard.bench.timing.alternated: each callable once a round, in turn, the first rounds left
out of the medians. A fake clock that the calls advance gives exact times (no real timing in
a pass/fail test).

Also the bench's command line at one rank (every JSON row carries "ranks", strict JSON, the
argument checks, the help) and the Slurm batch scripts run with a fake srun at one rank (the
demo test mode, the rank check, the memory check). No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from pyshard.bench import EXTRA_CASES, timing
from pyshard.bench import cli as bench_cli
from pyshard.bench.report import append_json, json_line
from pyshard.bench.timing import alternated


def test_alternated_runs_each_in_turn_and_skips_the_first_rounds(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    calls = []

    def a():
        calls.append("a")
        now[0] += 10.0 if calls.count("a") <= 2 else 1.0 + calls.count("a")  # 4, 5, 6 after

    def b():
        calls.append("b")
        now[0] += 3.0

    t = alternated({"a": a, "b": b}, MPI.COMM_SELF, rounds=5, skip=2)
    assert calls == ["a", "b"] * 5
    assert t == {"a": 5.0, "b": 3.0}  # a's two slow rounds left out: the median of 4, 5, 6


# --- the bench's command line (serial: one rank, the smallest sizes) -------------------------

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "--reps", "1", "--warmup", "0", "--shape", "16x8", "--checkpoint-bytes", "65536",
    "--checkpoint-reps", "2", "--memory-shapes", "2", "--fft-n", "8", "--fft-batch", "2x8",
    "--fft-backends", "numpy", "--fft-pfft=", "--halo-shape", "8x8", "--stencil-shape", "8x8",
    "--stencil-steps", "1", "--halo-loop", "1", "--many-count", "2", "--many-scale", "64",
    "--migrate-rows", "64", "--unstructured-rows", "64",
]  # fmt: skip


def _strict(line):
    """json.loads that refuses NaN and Infinity (bare tokens are not JSON)."""

    def bad(tok):
        raise ValueError(f"non-JSON constant {tok}")

    return json.loads(line, parse_constant=bad)


def _rows(tmp_path, argv):
    path = tmp_path / "rows.jsonl"
    assert bench_cli.main([*argv, "--json", str(path)]) == 0
    return [_strict(line) for line in path.read_text().splitlines()]


def test_every_row_carries_ranks(tmp_path, capsys):
    # the Slurm scripts check "ranks" on every line: every case's row must carry it
    cases = ["transpose", "small", *EXTRA_CASES]
    rows = _rows(tmp_path, ["--cases", ",".join(cases), *TINY])
    assert sorted({r["case"] for r in rows}) == sorted(cases)
    for r in rows:
        assert r.get("ranks") == 1, r["case"]
    ckpt = next(r for r in rows if r["case"] == "checkpoint")
    assert ckpt["reps"] == 2  # --checkpoint-reps, not a hard-coded 1
    sparse = next(r for r in rows if r["case"] == "sparse")
    assert [s["ranks"] for s in sparse["rows"]] == [256, 4096, 65536]  # simulated, apart
    rows = _rows(tmp_path, ["--cases", "checkpoint", "--formats", "npy", *TINY])
    assert rows[-1]["case"] == "checkpoint" and rows[-1]["ranks"] == 1
    out = capsys.readouterr().out
    for line in out.splitlines():  # the JSON lines printed on stdout are strict too
        if line.startswith("{"):
            assert "ranks" in _strict(line)


def test_header_names_the_shape_only_for_the_redistribution_cases(tmp_path, capsys):
    assert bench_cli.main(["--cases", "sparse", "--shape", "16x8", "--dtype", "float64"]) == 0
    cap = capsys.readouterr()
    head = cap.out.splitlines()[0]
    assert head.startswith("pyshard bench: 1 ranks, reps") and "16x8" not in head, head
    assert "--dtype float64 is used by the redistribution cases" in cap.err
    assert bench_cli.main(["--cases", "small", "--shape", "16x8", "--reps", "1"]) == 0
    assert "16x8 float32" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--reps", "0"], "--reps"), (["--reps", "-1"], "--reps"), (["--warmup", "-1"], "--warmup"),
        (["--halo-loop", "0"], "--halo-loop"), (["--stencil-steps", "0"], "--stencil-steps"),
        (["--checkpoint-reps", "0"], "--checkpoint-reps"), (["--many-count", "0"], "--many-count"),
        (["--migrate-rows", "0"], "--migrate-rows"),
        (["--unstructured-rows", "0"], "--unstructured-rows"), (["--fft-n", "0"], "--fft-n"),
        (["--fft-batch", "0x8"], "--fft-batch"), (["--fft-batch", "-1"], "--fft-batch"),
        (["--memory-shapes", "0"], "--memory-shapes"), (["--halo-scale", "0"], "--halo-scale"),
        (["--many-scale", "0"], "--many-scale"), (["--stencil-n", "0"], "--stencil-n"),
        (["--checkpoint-bytes", "0"], "--checkpoint-bytes"), (["--reps", "two"], "--reps"),
        (["--fft-pfft", "''"], "--fft-pfft"), (["--fft-pfft", "fftw,bogus"], "--fft-pfft"),
        (["--fft-backends", "fftw"], "--fft-backends"), (["--fft-kinds", "c2r"], "--fft-kinds"),
        (["--algorithm", "auto,bogus"], "--algorithm"), (["--dtype", "floaty"], "--dtype"),
        (["--shape", "16"], "--shape"), (["--halo-shape", "0x4"], "--halo-shape"),
        (["--cases", "transpose,bogus"], "--cases"),
    ],
)  # fmt: skip
def test_bad_arguments_are_argparse_errors(argv, option, capsys):
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err, err


def test_accepted_values_and_help():
    args = bench_cli.make_parser().parse_args(
        ["--fft-pfft=", "--fft-batch", "0", "--warmup", "0", "--algorithm", "tune,alltoallw,shm"]
    )
    assert args.fft_pfft == "" and args.fft_batch == "0" and args.warmup == 0
    assert bench_cli.make_parser().parse_args(["--fft-pfft", "none"]).fft_pfft == "none"
    text = bench_cli.make_parser().format_help()
    flat = " ".join(text.split())
    for name in bench_cli.ALGORITHM_NAMES:  # every value the code accepts
        assert name in flat, name
    assert "migrate (" in flat and "fft3d and fft cases" in flat
    assert "--checkpoint-reps" in flat and "checkpoint case (with or without --formats)" in flat


def test_json_rows_are_strict(tmp_path):
    row = {"case": "x", "ranks": 1, "a": float("nan"), "b": [float("inf"), 1.5],
           "c": {"d": np.float32("nan"), "e": np.float64(2.0)}}  # fmt: skip
    assert _strict(json_line(row)) == {"case": "x", "ranks": 1, "a": None, "b": [None, 1.5],
                                       "c": {"d": None, "e": 2.0}}  # fmt: skip
    path = tmp_path / "r.jsonl"
    append_json(str(path), [row, {"case": "y", "ranks": 1, "t": -math.inf}])
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and "NaN" not in path.read_text() and "Infinity" not in lines[1]
    assert [_strict(x)["case"] for x in lines] == ["x", "y"]


# --- the Slurm scripts, with a fake srun that runs the command itself (one rank) -------------


def _fake_srun(tmp_path):
    """An srun on PATH that logs its arguments and runs the command (srun's own options
    dropped): -n is 1 in these tests, so no MPI launcher is needed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> "{tmp_path}/srun.log"\n'
        "while [ $# -gt 0 ]; do\n"
        "  case $1 in -n|-N) shift 2 ;; -*) shift ;; *) break ;; esac\n"
        "done\n"
        'exec "$@"\n'
    )
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _sbatch(tmp_path, kind, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI", "MPI"))}
    e.update(
        PATH=f"{_fake_srun(tmp_path)}{os.pathsep}{e.get('PATH', '')}",
        PYSHARD_PYTHON=sys.executable,
        SLURM_NTASKS="1", SLURM_JOB_ID="7", RANKS="1", OUT_DIR=str(tmp_path / "out"),
        PYSHARD_SLURM_DIR=str(REPO / "slurm"), TMPDIR=str(tmp_path),
    )  # fmt: skip
    e.update(env)
    p = subprocess.run(["bash", str(REPO / "slurm" / f"{kind}_scaling.sbatch")], env=e,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    log = (tmp_path / "srun.log").read_text() if (tmp_path / "srun.log").exists() else ""
    return p, log


needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@needs_bash
@pytest.mark.parametrize("kind", ["stencil", "fft", "strong"])
def test_slurm_demo_mode_gets_no_bench_arguments(tmp_path, kind):
    # PYSHARD_CMD=demo, the test mode the headers document: demo's own arguments only
    p, log = _sbatch(tmp_path, kind, PYSHARD_CMD="demo", PER_RANK="16x16", FFT_N="8",
                     SHAPE="16x16", BENCH_ARGS="--reps 1 --halo-loop 2")
    assert p.returncode == 0, p.stdout + p.stderr
    runs = [line for line in log.splitlines() if " demo " in line]
    assert len(runs) == 1, log
    assert "--cases" not in runs[0] and "--reps" not in runs[0] and "--json" not in runs[0]
    want = {"stencil": "float64", "fft": "complex128", "strong": "float32"}[kind]
    assert f"--dtype {want}" in runs[0]
    assert f"global shape 16x16 {want}" in p.stdout or kind == "fft", p.stdout


@needs_bash
def test_slurm_rank_check_passes_with_every_case(tmp_path):
    # sparse and checkpoint rows carry "ranks": the rank check accepts a good run
    p, _ = _sbatch(tmp_path, "strong", SHAPE="16x16", MEM_CHECK="0", PREFLIGHT="0",
                   BENCH_ARGS="--reps 1 --warmup 0 --cases small,sparse,checkpoint "
                   "--checkpoint-bytes 4096")  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ranks check ok: 3 record(s), all ranks=1" in p.stdout, p.stdout
    rows = [_strict(x) for x in (tmp_path / "out" / "strong_7.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == ["small", "sparse", "checkpoint"]


@needs_bash
def test_slurm_memory_check_stops_before_any_run(tmp_path):
    # the weak default at 4 ranks: reduce_scatter holds ~7.5 global arrays (128 MiB) a rank
    p, log = _sbatch(tmp_path, "weak", MEM_PER_RANK_GB="0.8", PREFLIGHT="0", SLURM_NTASKS="4",
                     RANKS="4")
    assert p.returncode == 1
    assert "ERROR: not enough memory" in p.stderr and "reduce_scatter" in p.stderr, p.stderr
    assert "pyshard" not in log  # no run started
    # leaving those cases out fits: the estimate then follows the rank's share
    p, log = _sbatch(tmp_path / "2", "weak", MEM_PER_RANK_GB="0.3", PREFLIGHT="0",
                     PER_RANK="64x64", BENCH_ARGS="--cases transpose --reps 1 --warmup 0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "memory: about 0.3 GiB a rank at 1 ranks (transpose:" in p.stdout, p.stdout
