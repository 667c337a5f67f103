"""The bench command runs every case at a tiny size and writes well-formed JSON lines.

No timing is asserted here (timing belongs in the benchmark, not in pass/fail tests).
"""

from __future__ import annotations

import json
import os
import tempfile

import launch
import pytest

from pyshard.bench import CASES
from pyshard.bench import main as bench_main

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

KEYS = {
    "case", "shape", "dtype", "ranks", "mesh", "algorithm", "median_s", "min_s",
    "floor_median_s", "ratio_to_floor", "baseline_median_s", "ratio_to_baseline",
    "bytes_per_rank", "peak_extra_bytes", "gbps", "check",
}  # fmt: skip


def bench_rows(comm, argv):
    """Run the bench with ``argv`` and a temporary ``--json`` file shared by the ranks (it
    must exit 0); the JSON rows it wrote."""
    path = None
    if comm.rank == 0:
        fd, path = tempfile.mkstemp(suffix=".jsonl")
        os.close(fd)
    path = comm.bcast(path, root=0)
    try:
        assert bench_main([*argv, "--json", path]) == 0
        comm.Barrier()
        with open(path) as f:
            return [json.loads(line) for line in f]
    finally:
        comm.Barrier()
        if comm.rank == 0:
            os.unlink(path)


@pytest.mark.parametrize("algorithm", ["auto", "alltoall", "p2p", "alltoallw"])
def test_bench_cases_write_json(comm, algorithm):
    rows = bench_rows(
        comm,
        ["--cases", ",".join(CASES), "--shape", "24x17", "--reps", "2", "--warmup", "1",
         "--algorithm", algorithm],
    )  # fmt: skip
    assert [r["case"] for r in rows] == list(CASES)
    for r in rows:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["ranks"] == comm.size and r["check"] is True
        assert r["median_s"] > 0 and r["floor_median_s"] > 0
    if comm.size > 1:
        t = next(r for r in rows if r["case"] == "transpose")
        # S0 -> S1 of 24x17 float32: all but the diagonal blocks leave each rank
        assert t["bytes_per_rank"] > 0
        assert t["collective"] == "alltoallv" and t["mesh"] == [comm.size]


def test_plot(comm, tmp_path):
    launch.one_rank_only(comm)  # a plot of rows written here: no MPI in it
    pytest.importorskip("matplotlib")
    from pyshard.bench import plot_main

    rows = []
    for ranks in (1, 2, 4):
        for case in ("transpose", "gather"):
            rows.append(
                {"case": case, "algorithm": "auto", "ranks": ranks, "median_s": 0.01 / ranks,
                 "ratio_to_floor": 1.2, "ratio_to_baseline": 0.7, "gbps": 3.0}
            )  # fmt: skip
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "p.png"
    assert plot_main([str(f), "-o", str(out)]) == 0
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_bench_halo_and_stencil_write_json(comm):
    rows = bench_rows(
        comm,
        ["--cases", "halo,stencil", "--halo-scale", "256", "--halo-loop", "2", "--reps", "3",
         "--stencil-n", "24", "--stencil-steps", "2"],
    )  # fmt: skip
    assert [r["case"] for r in rows] == ["halo", "stencil"]
    halo, stencil = rows
    assert [r["name"] for r in halo["rows"]] == ["2d-w1", "2d-w4", "3d-w2"]
    for r in halo["rows"]:
        t = r["times_s"]
        assert t["pyshard-persistent"] > 0 and t["pyshard-p2p"] > 0 and t["floor"] > 0
        assert r["vs_floor"] > 0
    assert [s["peers"] for s in halo["setup"]] == [8, 8, 8]
    assert stencil["star"]["blocking_s"] > 0 and stencil["box"]["ratio"] > 0


def test_bench_many_writes_json(comm):
    (row,) = bench_rows(
        comm, ["--cases", "many", "--many-count", "12", "--many-scale", "32", "--reps", "2"]
    )
    assert row["case"] == "many" and row["arrays"] == 12 and row["ranks"] == comm.size
    assert row["many_s"] > 0 and row["loop_s"] > 0 and row["floor_s"] > 0
    assert row["floor"] in ("Alltoall", "Alltoallv")


def test_bench_migrate_writes_json(comm):
    (row,) = bench_rows(comm, ["--cases", "migrate", "--migrate-rows", "3000", "--reps", "1",
                               "--warmup", "0"])
    assert row["case"] == "migrate" and row["ranks"] == comm.size and row["check"] is True
    assert [o["pattern"] for o in row["rows"]] == ["1%", "10%", "50%", "uniform"]
    for o in row["rows"]:
        assert all(v > 0 for v in o["ms"].values())
        # NBX sends to the ranks that get rows only: at most the other ranks, none on one rank
        assert 0 <= o["max_messages_per_rank"] <= comm.size - 1
    assert row["simulated"]["ranks"] == 65536 and 1 <= row["simulated"]["nbx_messages"] <= 8


def test_bench_unstructured_writes_json(comm):
    (row,) = bench_rows(comm, ["--cases", "unstructured", "--unstructured-rows", "2000",
                               "--reps", "1", "--warmup", "0"])
    assert row["case"] == "unstructured" and row["ranks"] == comm.size and row["check"] is True
    assert [o["pattern"] for o in row["rows"]] == ["mesh", "random"]
    for o in row["rows"]:
        assert all(v > 0 for v in o["ms"].values()) and "gather_result" in o["ms"]
        assert o["reads"] == 200 and 0 <= o["max_peers"] <= comm.size - 1
    # ring neighbours: at most 2 peers for the mesh pattern
    assert row["rows"][0]["max_peers"] <= 2
    s = row["simulated"]
    assert s["ranks"] == 65536 and s["mesh"]["owners"] == 8 and s["mesh"]["reads"] == 260
    assert s["random"]["owners"] > 300


def test_bench_checkpoint_that_reads_back_wrong_data_fails(comm, monkeypatch, capsys):
    """The checkpoint case whose round trip reads back other data (injected: its row says
    so) makes the bench exit 1 and say WRONG (its row said "ok": false and the bench exited
    0: main read only "check")."""
    import pyshard.bench.cli as cli

    real = cli.bench_checkpoint

    def wrong(*a, **k):
        return {**real(*a, **k), "ok": False}

    monkeypatch.setattr(cli, "bench_checkpoint", wrong)
    rc = bench_main(["--cases", "checkpoint", "--checkpoint-bytes", "4096", "--reps", "1",
                     "--warmup", "0"])
    assert rc == 1
    if comm.rank == 0:
        assert "checkpoint: WRONG" in capsys.readouterr().err
