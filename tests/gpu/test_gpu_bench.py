"""``python -m pyshard bench --device cuda`` at a tiny size: results checked, rows well formed.

No timing is asserted (the pack kernel's 70% target is the benchmark's to report, not a
pass/fail test). Skipped without a GPU.
"""

from __future__ import annotations

import pytest
from gpu_helpers import skip_reason
from test_bench import bench_rows

from pyshard.bench import main as bench_main

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("shape", ["96x64", "37x23"])
def test_bench_cuda_rows(comm, transport, shape):
    rows = bench_rows(
        comm,
        ["--device", "cuda", "--shape", shape, "--reps", "2", "--warmup", "1",
         "--algorithm", "auto,p2p"],
    )  # fmt: skip
    cases = [(r["case"], r.get("algorithm")) for r in rows]
    assert cases == [
        ("transpose", "auto"), ("transpose", "p2p"), ("gather", "auto"), ("gather", "p2p"),
        ("pack_kernel", None),
    ]  # fmt: skip
    path_name = "staged" if transport == "staged" else "device_direct"
    for r in rows[:-1]:
        assert r["check"] is True and r["device"] == "cuda" and r["ranks"] == comm.size
        assert r["transport"] == transport
        assert r["pyshard_path"] == (path_name if comm.size > 1 else "none")
        assert r["median_s"] > 0 and r["hand_median_s"] > 0
    pack = rows[-1]
    if comm.size > 1:
        assert pack["check"] is True and pack["fraction"] > 0, pack
        assert pack["bytes"] > 0
    else:
        assert pack["fraction"] is None


def test_bench_cuda_rejects_host_only_cases(comm):
    assert bench_main(["--device", "cuda", "--cases", "reduce_scatter"]) == 2
