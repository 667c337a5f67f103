"""``python -m pyshard plot``: figures of the JSON lines that ``python -m pyshard bench
--json`` writes, one panel per case: bars by algorithm next to the floor for one rank count,
time against ranks with the floor and an ideal line for several (the Slurm scaling runs).
The halo, stencil, fft and fft3d rows get panels of their own (:func:`extra_points`: time
against ranks, one line per implementation); the other cases' rows are skipped with a note."""

from __future__ import annotations

import argparse
import json
import os
import sys
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .cases import CASES, EXTRA_CASES


def mpi_name(s: str) -> str:
    """A short MPI library name for a title: 'MPICH 5.0.2', 'Open MPI v5.0.3', ..."""
    s = " ".join(str(s).split()).split(",")[0]
    return s.replace(" Version:", "").strip() or "MPI ?"


def _plot_shape(r: Dict) -> str:
    shape = r.get("shape")
    return "x".join(map(str, shape)) if shape else "?"


def _plot_unit(seconds: float) -> Tuple[float, str]:
    """A scale and unit that keep the axis numbers short: s, ms or us."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "\u00b5s"


def _plot_times(r: Dict) -> Dict[str, float]:
    """The times of one row (seconds); older rows carry ratios instead of some of them."""
    med = float(r["median_s"])
    out = {"pyshard": med}
    if r.get("plain_median_s"):
        out["plain"] = float(r["plain_median_s"])
    if r.get("baseline_median_s"):
        out["baseline"] = float(r["baseline_median_s"])
    elif r.get("ratio_to_baseline"):
        out["baseline"] = med / float(r["ratio_to_baseline"])
    if r.get("floor_median_s"):
        out["floor"] = float(r["floor_median_s"])
    elif r.get("ratio_to_floor"):
        out["floor"] = med / float(r["ratio_to_floor"])
    if r.get("same_floor_median_s"):
        out["same_floor"] = float(r["same_floor_median_s"])
    return out


def _plot_case_order(cases: Sequence[str]) -> List[str]:
    known = [c for c in CASES if c in cases]
    return known + sorted(c for c in cases if c not in CASES)


def _plot_algo_order(algos: Sequence[str]) -> List[str]:
    order = ("auto", "tune", "alltoallv", "alltoall", "p2p", "alltoallw")
    return [a for a in order if a in algos] + sorted(a for a in algos if a not in order)


def _plot_grid(n: int, plt: Any, panel: Tuple[float, float], top: float) -> Tuple[Any, list]:
    ncols = min(n, 4)
    nrows = -(-n // ncols)
    w, h = panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + top), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _plot_bars(rows: List[Dict], plt: Any, extra: int = 0) -> Any:
    """One panel per case: bars grouped by algorithm, the floor as a horizontal line;
    ``extra`` more panels at the end (returned after the cases' own)."""
    last: Dict[Tuple[str, str], Dict] = {}
    for r in rows:  # several runs of one case and algorithm: the last one counts
        last[(r["case"], r["algorithm"])] = r
    cases = _plot_case_order(sorted({c for c, _ in last}))
    fig, axes = _plot_grid(len(cases) + extra, plt, (3.9, 3.3), 1.0)
    series = [
        ("pyshard", "pyshard (out=)", "#1f77b4"),
        ("plain", "pyshard (new result)", "#9ecae1"),
        ("baseline", "mpi4py + numpy by hand", "#ff7f0e"),
    ]
    for ax, case in zip(axes, cases):
        algos = _plot_algo_order([a for c, a in last if c == case])
        times = [_plot_times(last[(case, a)]) for a in algos]
        present = [s for s in series if any(s[0] in t for t in times)]
        peak = max(max(t.values()) for t in times)
        scale, unit = _plot_unit(peak)
        width = 0.8 / len(present)
        xs = np.arange(len(algos))
        for i, (key, label, color) in enumerate(present):
            vals = [t.get(key, np.nan) * scale for t in times]
            ax.bar(xs + (i - (len(present) - 1) / 2) * width, vals, width, label=label, color=color)
        floors = [t["floor"] for t in times if "floor" in t]
        if floors:
            floor = float(np.median(floors)) * scale
            coll = last[(case, algos[0])].get("floor_collective", "")
            ax.axhline(floor, color="k", lw=1.2, label="floor: fastest raw MPI collective")
            ax.annotate(
                f"floor {floor:.3g} {unit}" + (f" ({coll})" if coll else ""),
                (0.99, floor),
                xycoords=("axes fraction", "data"),
                xytext=(0, 2),
                textcoords="offset points",
                fontsize=7,
                ha="right",
                va="bottom",
                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            )
            for x, t in zip(xs, times):  # the collective this algorithm calls, when it differs
                same = t.get("same_floor")
                if same is not None and abs(same * scale - floor) > 0.02 * floor:
                    ax.hlines(
                        same * scale,
                        x - 0.45,
                        x + 0.45,
                        colors="k",
                        linestyles="--",
                        lw=1.0,
                        label="floor: same raw collective",
                    )
        r0 = last[(case, algos[0])]
        ax.set_title(f"{case}  ({_plot_shape(r0)}, {r0.get('collective', '')})", fontsize=9)
        ax.set_xticks(xs, algos, fontsize=8)
        ax.set_ylabel(f"time per call ({unit})", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(0, peak * scale * 1.15)
        ax.grid(axis="y", alpha=0.3)
        for i, t in enumerate(times):  # how far from the floor: ratio above each group
            if "floor" in t and t["floor"] > 0:
                ax.annotate(
                    f"{t['pyshard'] / t['floor']:.2f}x",
                    (xs[i], peak * scale * 1.1),
                    ha="center",
                    fontsize=7,
                    color="#1f77b4",
                )
    return fig, axes


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


def best_rows(rows: List[Dict]) -> Dict[Tuple[str, str, int], Dict]:
    """(case, algorithm, ranks) -> the fastest row: several files may hold one rank count."""
    best: Dict[Tuple[str, str, int], Dict] = {}
    for r in rows:
        k = (r["case"], r["algorithm"], int(r["ranks"]))
        if k not in best or r["median_s"] < best[k]["median_s"]:
            best[k] = r
    return best


def mixed_curves(rows: List[Dict]) -> List[str]:
    """The (case, algorithm) curves whose rows at one rank count hold several shapes or
    dtypes (files of different runs given together): a curve then joins the fastest of each,
    which is no scaling of one problem."""
    seen: Dict[Tuple[str, str, int], set] = {}
    for r in rows:
        k = (r["case"], r["algorithm"], int(r["ranks"]))
        seen.setdefault(k, set()).add((_plot_shape(r), str(r.get("dtype"))))
    return sorted({f"{c} {a}" for (c, a, _), v in seen.items() if len(v) > 1})


def ideal_line(best: Dict[Tuple[str, str, int], Dict], case: str, ideal: str) -> Tuple:
    """(ranks, seconds, label) of the ideal line of ``case``, from its fastest time at the
    smallest rank count; ([], [], "") when there is none to draw.

    bytes: the time grows or shrinks with the bytes each rank sends (``bytes_per_rank``),
    i.e. constant bandwidth per rank: 1/ranks for a strong-scaling transpose, flat for a
    weak-scaling one, and no speed-up for a gather of a fixed array, whose every rank must
    receive nearly all of it. strong: time x ranks constant. weak: time constant. auto:
    bytes when every row has its bytes, else strong or weak from the shapes."""
    rows = {n: r for (c, _, n), r in best.items() if c == case}
    ranks = sorted(rows)
    if ideal == "none" or len(ranks) < 2:
        return [], [], ""
    n0 = ranks[0]
    t0 = min(r["median_s"] for (c, _, n), r in best.items() if c == case and n == n0)
    nbytes = {n: r.get("bytes_per_rank") or 0 for n, r in rows.items()}
    if ideal == "auto":
        ideal = "bytes" if all(nbytes.values()) else scaling_kind(best, case)
    if ideal == "bytes":
        times = [t0 * nbytes[n] / nbytes[n0] for n in ranks]
        return ranks, times, "ideal: time \u221d bytes sent per rank"
    if ideal == "strong":
        return ranks, [t0 * n0 / n for n in ranks], "ideal: time x ranks constant"
    if ideal == "weak":
        return ranks, [t0] * len(ranks), "ideal: time constant"
    return [], [], ""


def _plot_scaling(rows: List[Dict], plt: Any, ideal: str, extra: int = 0) -> Any:
    """One panel per case: time per call against ranks, one line per algorithm, the floor
    (the fastest raw MPI collective at each rank count) and the ideal line; ``extra`` more
    panels at the end (returned after the cases' own)."""
    best = best_rows(rows)
    cases = _plot_case_order(sorted({c for c, _, _ in best}))
    fig, axes = _plot_grid(len(cases) + extra, plt, (3.9, 3.4), 0.75)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, case in zip(axes, cases):
        algos = _plot_algo_order(sorted({a for c, a, _ in best if c == case}))
        ranks_all = sorted({n for c, _, n in best if c == case})
        scale, unit = _plot_unit(max(r["median_s"] for k, r in best.items() if k[0] == case))
        for j, a in enumerate(algos):
            pts = sorted(
                (n, r["median_s"]) for (c, al, n), r in best.items() if (c, al) == (case, a)
            )
            ax.plot(
                [n for n, _ in pts],
                [t * scale for _, t in pts],
                "o-",
                color=colors[j % len(colors)],
                label=a,
                lw=1.5,
                ms=4,
            )
        floor: Dict[int, float] = {}
        for (c, _, n), r in best.items():
            f = _plot_times(r).get("floor")
            if c == case and f:
                floor[n] = min(floor.get(n, np.inf), f)
        if floor:
            pts = sorted(floor.items())
            ax.plot(
                [n for n, _ in pts],
                [t * scale for _, t in pts],
                "s--",
                color="0.45",
                lw=1.0,
                ms=3,
                label="floor: fastest raw MPI collective",
            )
        xs, ys, label = ideal_line(best, case, ideal)
        if xs:
            ax.plot(xs, [y * scale for y in ys], ":", color="k", lw=1.4, label=label)
        r0 = best[next(k for k in best if k[0] == case)]
        _log_axes(ax, ranks_all, f"time per call ({unit}, log)",
                  f"{case}  ({r0.get('collective', '')})")
    return fig, axes


def _log_axes(ax: Any, ranks_all: List[int], ylabel: str, title: str) -> None:
    """One panel's axes: ranks (log 2) against time (log 10), labelled and gridded."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks_all, [str(n) for n in ranks_all], fontsize=8)
    ax.minorticks_off()
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("ranks", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")


PLOTTED_EXTRA = ("halo", "stencil", "fft", "fft3d")
"""The extra cases that ``pyshard plot`` draws (time against ranks, one panel per grid or
transform); the others (checkpoint, memory, sparse, many, migrate, unstructured) are skipped
with a note."""

Points = Dict[str, Dict[str, Dict[int, float]]]  # panel -> series -> ranks -> seconds


def extra_points(rows: List[Dict]) -> Points:
    """The times of the rows of :data:`PLOTTED_EXTRA` (the Slurm stencil and fft runs):
    panel -> series -> ranks -> seconds, the fastest where several rows hold one rank count.

    halo: one panel per grid (``halo 2d-w1``, ...): pyshard (auto), the pre-packed floor,
    mpi4py by hand, per update. stencil: blocking and overlapped heat steps, star and box, per
    step. fft: one panel per kind and decomposition, each implementation's time per transform
    (the mean of forward and backward) and the raw MPI floor of pyshard's transposes; the
    batched 2-D case's forward times. fft3d: pyshard (per algorithm) and PFFT, total."""
    pts: Points = {}

    def add(panel: str, series: str, ranks: int, seconds: Any) -> None:
        if isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds > 0:
            d = pts.setdefault(panel, {}).setdefault(series, {})
            d[ranks] = min(d.get(ranks, np.inf), float(seconds))

    for r in rows:
        case, n = r.get("case"), r.get("ranks")
        if case not in PLOTTED_EXTRA or not isinstance(n, int):
            continue
        if case == "halo":
            for h in r.get("rows", []):
                t = h.get("times_s", {})
                for key, label in (("pyshard-auto", "pyshard (auto)"),
                                   ("floor", "floor: pre-packed p2p"),
                                   ("mpi4py", "mpi4py by hand")):
                    add(f"halo {h.get('name', '?')}", label, n, t.get(key))
        elif case == "stencil":
            for st in ("star", "box"):
                t = r.get(st) or {}
                add("stencil (per step)", f"{st} blocking", n, t.get("blocking_s"))
                add("stencil (per step)", f"{st} overlapped", n, t.get("overlapped_s"))
        elif case == "fft":
            for c in r.get("cases", []):
                panel = f"fft {c.get('kind', '?')} {c.get('decomp', '?')} n={r.get('n', '?')}"
                for name, imp in (c.get("impls") or {}).items():
                    ms = imp.get("per_transform_ms") if isinstance(imp, dict) else None
                    add(panel, name, n, None if ms is None else ms / 1e3)
                fl = c.get("mpi_floor_ms") or {}
                vals = [v for v in fl.values() if isinstance(v, (int, float))]
                if vals:
                    add(panel, "floor: raw MPI transposes", n, sum(vals) / len(vals) / 1e3)
            bt = r.get("batched") or {}
            for name, ms in (bt.get("forward_ms") or {}).items():
                shape = "x".join(map(str, bt.get("shape", [])))
                add(f"fft batched {shape} (forward)", name, n,
                    None if ms is None else ms / 1e3)
        else:  # fft3d
            add("fft3d", f"pyshard {r.get('algorithm', 'auto')}", n,
                None if r.get("pyshard_total_ms") is None else r["pyshard_total_ms"] / 1e3)
            add("fft3d", "PFFT", n,
                None if r.get("pfft_total_ms") is None else r["pfft_total_ms"] / 1e3)
    return pts


def _plot_extra(pts: Points, axes: Sequence[Any], plt: Any) -> None:
    """One panel per entry of :func:`extra_points`: time against ranks, one line a series."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes, sorted(pts)):
        series = pts[panel]
        ranks_all = sorted({n for d in series.values() for n in d})
        scale, unit = _plot_unit(max(t for d in series.values() for t in d.values()))
        for j, (name, d) in enumerate(sorted(series.items())):
            xs = sorted(d)
            style = "s--" if name.startswith("floor") else "o-"
            ax.plot(xs, [d[x] * scale for x in xs], style, color=colors[j % len(colors)],
                    label=name, lw=1.5, ms=4)
        _log_axes(ax, ranks_all, f"time ({unit}, log)", panel)
        ax.legend(fontsize=6, loc="best")


def scaling_kind(best: Dict[Tuple[str, str, int], Dict], case: str) -> str:
    """strong when the global shape is the same at every rank count, weak when the elements
    per rank are, else none (no ideal line)."""
    sizes = {n: prod(r["shape"]) for (c, _, n), r in best.items() if c == case and r.get("shape")}
    if len(set(sizes.values())) == 1:
        return "strong"
    if len({s / n for n, s in sizes.items()}) == 1:
        return "weak"
    return "none"


def plot_main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard plot FILE... -o out.png``: one panel per case. One rank count:
    bars grouped by algorithm (pyshard with ``out=``, pyshard returning a new array, the
    hand-written mpi4py + numpy baseline) and the floor (the fastest raw MPI collective on
    pre-packed buffers) as a horizontal line. Several rank counts (the Slurm scaling runs):
    time per call against ranks, one line per algorithm, the floor and the ideal line."""
    ap = argparse.ArgumentParser(prog="python -m pyshard plot")
    ap.add_argument("files", nargs="+", help="JSON lines written by pyshard bench --json")
    ap.add_argument("-o", "--output", default="bench.png")
    ap.add_argument(
        "--ideal",
        choices=("auto", "bytes", "strong", "weak", "none"),
        default="auto",
        help="the ideal line of a scaling plot (several rank counts): bytes (time in "
        "proportion to the bytes each rank sends: constant bandwidth per rank), strong (time "
        "x ranks constant), weak (time constant); auto (default): bytes when the rows have "
        "bytes_per_rank, else strong or weak from the shapes",
    )
    ap.add_argument("--title", default=None, help="replace the title")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("python -m pyshard plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    ext = os.path.splitext(args.output)[1].lstrip(".").lower()
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if ext not in formats:
        print(f"python -m pyshard plot: -o {args.output!r}: matplotlib writes "
              f"{', '.join(sorted(formats))}; name the file with one of them", file=sys.stderr)
        return 1
    rows = []
    for fn in args.files:
        with open(fn, encoding="utf-8", errors="strict") as f:
            for k, line in enumerate(f, 1):
                if not line.strip():
                    continue
                r = json.loads(line)
                if not isinstance(r, dict):
                    raise ValueError(f"{fn}: line {k} is JSON but not an object "
                                     f"({line.strip()[:40]!r})")
                rows.append(r)
    bad = [r for r in rows if "median_s" in r and not _number(r["median_s"])]
    if bad:
        print(f"pyshard plot: {len(bad)} row(s) without a time (median_s "
              f"{bad[0]['median_s']!r}) left out", file=sys.stderr)
        rows = [r for r in rows if not ("median_s" in r and not _number(r["median_s"]))]
    pts = extra_points(rows)
    mpis = sorted({mpi_name(r["mpi"]) for r in rows if r.get("mpi")}) or ["MPI not recorded"]
    skipped = sorted({str(r.get("case")) for r in rows
                      if r.get("case") in EXTRA_CASES and r.get("case") not in PLOTTED_EXTRA})
    rows = [
        r
        for r in rows
        if r.get("case") not in EXTRA_CASES
        and {"case", "algorithm", "ranks", "median_s"} <= set(r)
        and ("floor_median_s" in r or "ratio_to_floor" in r)
    ]
    if skipped:
        print(f"pyshard plot: not plotted (no plot for these cases): {', '.join(skipped)}",
              file=sys.stderr)
    if not rows and not pts:
        print("no benchmark rows in the given files (pyshard plot draws the redistribution "
              f"cases and {', '.join(PLOTTED_EXTRA)})", file=sys.stderr)
        return 1
    n_extra = len(pts)
    ranks = sorted({int(r["ranks"]) for r in rows}
                   | {n for d in pts.values() for s in d.values() for n in s})
    dtypes = sorted({str(r["dtype"]) for r in rows if r.get("dtype")})
    bars = len({int(r["ranks"]) for r in rows}) == 1
    if not rows:
        fig, axes = _plot_grid(n_extra, plt, (3.9, 3.4), 0.75)
        what = "pyshard " + " / ".join(sorted({p.split()[0] for p in pts}))
        detail = f"{ranks[0]} to {ranks[-1]} ranks" if len(ranks) > 1 else f"{ranks[0]} ranks"
    elif bars:
        fig, axes = _plot_bars(rows, plt, n_extra)
        what = "pyshard bench"
        shapes = sorted({_plot_shape(r) for r in rows if r["case"] != "small"})
        detail = f"{ranks[0]} rank{'s' if ranks[0] != 1 else ''}"
        if shapes:
            detail += f", {' / '.join(shapes)} {' / '.join(dtypes)}"
    else:
        mixed = mixed_curves(rows)
        if mixed:
            print(f"pyshard plot: warning: {', '.join(mixed)}: one rank count has rows of "
                  f"several shapes or dtypes (the files are of different runs); each curve "
                  f"takes the fastest of them", file=sys.stderr)
        fig, axes = _plot_scaling(rows, plt, args.ideal, n_extra)
        best = best_rows(rows)
        kinds = {scaling_kind(best, c) for c in {r["case"] for r in rows}}
        kind = kinds.pop() if len(kinds) == 1 else "none"
        what = f"pyshard {kind} scaling" if kind != "none" else "pyshard scaling"
        detail = f"{ranks[0]} to {ranks[-1]} ranks"
        big = [r for r in rows if r["case"] != "small" and r.get("shape")]
        if kind == "strong" and big:
            detail += f", {' / '.join(sorted({_plot_shape(r) for r in big}))}"
        elif kind == "weak" and big:
            lo = min(big, key=lambda r: r["ranks"])
            hi = max(big, key=lambda r: r["ranks"])
            detail += f", {_plot_shape(lo)} to {_plot_shape(hi)}"
        if dtypes:
            detail += f" {' / '.join(dtypes)}"
    own, axes = axes[: len(axes) - n_extra], axes[len(axes) - n_extra:]
    _plot_extra(pts, axes, plt)
    axes = own  # the figure legend: the redistribution panels' (the others have their own)
    title = args.title or f"{what}: {' / '.join(mpis)}, {detail}"
    height = fig.get_figheight()  # inches; the top holds the title, legend (and note)
    top = 0.95 if rows and bars else 0.75
    fig.tight_layout(rect=(0, 0, 1, 1 - top / height))  # before the figure-level texts
    fig.suptitle(title, fontsize=11, y=1 - 0.1 / height, va="top")
    handles: Dict[str, Any] = {}
    for ax in axes:  # one legend for the figure, each entry once
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(
            handles.values(),
            handles.keys(),
            loc="upper center",
            ncol=len(handles) if len(handles) <= 5 else 4,
            fontsize=8,
            frameon=False,
            bbox_to_anchor=(0.5, 1 - 0.38 / height),
        )
    if rows and bars:
        note = "above each group: pyshard (out=) time / floor; lower is better"
        fig.text(0.5, 1 - 0.72 / height, note, ha="center", va="top", fontsize=7, color="0.3")
    fig.savefig(args.output, dpi=110)
    plt.close(fig)
    print(f"wrote {args.output} ({len(rows)} redistribution rows, {n_extra} other panels, "
          f"ranks {ranks})")
    return 0
