"""python -m pyshard plot: one panel per case, bars by algorithm with the floor as a line, a
title naming the MPI library and the rank count; several rank counts give the scaling plot
with an ideal line. No MPI communication (plot_main only reads JSON lines)."""

from __future__ import annotations

import json

import pytest

from pyshard.bench import plot

pytest.importorskip("matplotlib")


def _row(case, algorithm, ranks, median_s, shape=(1024, 1024), **kw):
    r = {
        "case": case, "algorithm": algorithm, "ranks": ranks, "shape": list(shape),
        "dtype": "float32", "collective": "alltoallv", "median_s": median_s,
        "plain_median_s": median_s * 1.2, "baseline_median_s": median_s * 2,
        "floor_median_s": median_s / 1.1, "floor_collective": "Alltoall",
        "ratio_to_floor": 1.1, "same_floor_median_s": median_s / 1.05,
        "same_floor_collective": "Alltoallv", "bytes_per_rank": 4 << 20 // ranks,
        "mpi": "MPICH Version:      5.0.2", "check": True,
    }  # fmt: skip
    r.update(kw)
    return r


def _write(tmp_path, rows, name="r.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(f)


def _png(path):
    with open(path, "rb") as f:
        data = f.read()
    return len(data) > 1000 and data[:4] == b"\x89PNG"


def _title(monkeypatch):
    """Capture the figure's title at savefig."""
    import matplotlib.figure

    seen = {}
    orig = matplotlib.figure.Figure.savefig

    def savefig(self, *a, **kw):
        seen["title"] = self._suptitle.get_text() if self._suptitle else ""
        seen["panels"] = [ax.get_title() for ax in self.axes if ax.get_visible()]
        return orig(self, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return seen


def test_bars_one_panel_per_case(tmp_path, monkeypatch):
    rows = [
        _row(c, a, 2, t)
        for c, t in (("transpose", 0.02), ("gather", 0.05), ("small", 9e-6))
        for a in ("auto", "alltoall", "p2p")
    ]
    rows.append({"case": "checkpoint", "ranks": 2, "save_gbps": 1.0})  # other rows: ignored
    seen = _title(monkeypatch)
    out = str(tmp_path / "b.png")
    assert plot.plot_main([_write(tmp_path, rows), "-o", out]) == 0
    assert _png(out)
    assert "MPICH 5.0.2" in seen["title"] and "2 ranks" in seen["title"], seen
    assert [p.split()[0] for p in seen["panels"]] == ["transpose", "gather", "small"]


def test_old_rows_without_floor_times(tmp_path):
    # rows from before floor_median_s: the floor comes from ratio_to_floor
    rows = [
        {"case": "transpose", "algorithm": a, "ranks": 2, "median_s": 0.01,
         "ratio_to_floor": 1.2, "ratio_to_baseline": 0.7, "gbps": 3.0}
        for a in ("auto", "p2p")
    ]  # fmt: skip
    out = str(tmp_path / "o.png")
    assert plot.plot_main([_write(tmp_path, rows), "-o", out]) == 0 and _png(out)


def test_scaling_plot_and_ideal_lines(tmp_path, monkeypatch):
    strong = [
        _row(c, a, n, 0.04 / n, bytes_per_rank=(1 << 24) // n)
        for c in ("transpose", "gather")
        for a in ("auto", "p2p")
        for n in (2, 4, 8)
    ]
    seen = _title(monkeypatch)
    out = str(tmp_path / "s.png")
    files = [_write(tmp_path, strong[:6], "a.jsonl"), _write(tmp_path, strong[6:], "b.jsonl")]
    assert plot.plot_main([*files, "-o", out]) == 0 and _png(out)
    assert "strong scaling" in seen["title"] and "MPICH 5.0.2" in seen["title"], seen
    assert "2 to 8 ranks" in seen["title"], seen

    best = plot.best_rows(strong)
    xs, ys, _ = plot.ideal_line(best, "transpose", "auto")  # bytes per rank: 1/ranks
    assert xs == [2, 4, 8] and ys == pytest.approx([0.02, 0.01, 0.005])
    xs, ys, _ = plot.ideal_line(best, "transpose", "weak")
    assert ys == pytest.approx([0.02] * 3)
    assert plot.ideal_line(best, "transpose", "none")[0] == []

    weak = [_row("transpose", "auto", n, 0.01, shape=(512 * n, 512)) for n in (2, 4)]
    assert plot.scaling_kind(plot.best_rows(weak), "transpose") == "weak"
    assert plot.scaling_kind(best, "transpose") == "strong"


def test_mpi_names():
    assert plot.mpi_name("MPICH Version:      5.0.2") == "MPICH 5.0.2"
    assert plot.mpi_name("Open MPI v5.0.3, package: Open MPI x, ident: 5.0.3") == (
        "Open MPI v5.0.3"
    )


def test_no_rows(tmp_path):
    f = _write(tmp_path, [{"case": "memory", "ranks": 2}])
    assert plot.plot_main([f, "-o", str(tmp_path / "n.png")]) == 1


def _halo(ranks, t):
    times = {"pyshard-auto": t, "floor": t / 2, "mpi4py": 2 * t, "copy": t / 4}
    return {"case": "halo", "ranks": ranks, "mpi": "MPICH Version:      5.0.2",
            "rows": [{"name": "2d-w1", "times_s": times}]}  # fmt: skip


def _stencil(ranks, t):
    st = {"blocking_s": t, "overlapped_s": t * 0.8}
    return {"case": "stencil", "ranks": ranks, "star": st, "box": st}


def _fft(ranks, ms):
    impl = {"per_transform_ms": ms}
    return {"case": "fft", "ranks": ranks, "n": 16,
            "cases": [{"kind": "c2c", "decomp": "slab", "impls": {"pyshard-scipy": impl},
                       "mpi_floor_ms": {"forward": ms / 4, "backward": ms / 4}}],
            "batched": {"shape": [4, 16, 16], "forward_ms": {"pyshard-scipy": ms / 2}}}  # fmt: skip


def test_stencil_and_fft_rows_are_plotted(tmp_path, monkeypatch, capsys):
    # the Slurm stencil and fft sweeps: time against ranks, a panel per grid or transform
    rows = [f(n, 0.01 / n) for n in (2, 4) for f in (_halo, _stencil, _fft)]
    rows.append({"case": "memory", "ranks": 2})  # no plot for it: skipped, with a note
    rows.append({"case": "fft3d", "ranks": 2, "algorithm": "auto", "pyshard_total_ms": 1.0,
                 "pfft_total_ms": None})  # fmt: skip
    seen = _title(monkeypatch)
    out = str(tmp_path / "x.png")
    assert plot.plot_main([_write(tmp_path, rows), "-o", out]) == 0 and _png(out)
    assert seen["panels"] == ["fft batched 4x16x16 (forward)", "fft c2c slab n=16", "fft3d",
                              "halo 2d-w1", "stencil (per step)"], seen  # fmt: skip
    assert "MPICH 5.0.2" in seen["title"] and "2 to 4 ranks" in seen["title"], seen
    assert "not plotted" in capsys.readouterr().err
    pts = plot.extra_points(rows)
    assert pts["halo 2d-w1"]["pyshard (auto)"] == {2: 0.005, 4: 0.0025}
    assert pts["fft c2c slab n=16"]["floor: raw MPI transposes"] == {
        2: pytest.approx(0.005 / 4e3), 4: pytest.approx(0.0025 / 4e3)}  # the mean, in s
    assert "PFFT" not in pts["fft3d"]  # not measured: no point

    # with redistribution rows: their panels first, then these
    both = rows + [_row("transpose", "auto", n, 0.02 / n) for n in (2, 4)]
    seen = _title(monkeypatch)
    assert plot.plot_main([_write(tmp_path, both, "b.jsonl"), "-o", out]) == 0
    assert seen["panels"][0].startswith("transpose") and len(seen["panels"]) == 6, seen
