"""The benchmark's reports: the table of the redistribution cases and JSON lines."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List

from .cases import EXTRA_CASES


def format_table(rows: List[Dict]) -> str:
    """The table of the redistribution cases' rows (other rows are left out), one line each."""
    head = (
        f"{'case':<18}{'algorithm':<11}{'shape':<12}{'median ms':>10}{'plain ms':>9}"
        f"{'floor ms':>9} {'(fastest raw)':<21}{'x floor':>8}{'x same':>7}{'base ms':>9}"
        f"{'x base':>7}{'MB/rank':>9}{'GB/s':>6}{'extra/loc':>10}  check"
    )
    lines = [head]
    for r in rows:
        if r["case"] in EXTRA_CASES:
            continue
        shape = "x".join(map(str, r["shape"]))
        lines.append(
            f"{r['case']:<18}{r['algorithm']:<11}{shape:<12}{r['median_s'] * 1e3:>10.3f}"
            f"{r['plain_median_s'] * 1e3:>9.3f}"
            f"{r['floor_median_s'] * 1e3:>9.3f} {r['floor_collective']:<21}"
            f"{r['ratio_to_floor']:>8.2f}{r['ratio_to_same_floor']:>7.2f}"
            f"{r['baseline_median_s'] * 1e3:>9.3f}{r['ratio_to_baseline']:>7.2f}"
            f"{r['bytes_per_rank'] / 1e6:>9.2f}{r['gbps']:>6.2f}"
            f"{r['peak_extra_bytes'] / max(r['local_bytes'], 1):>10.2f}  "
            f"{'ok' if r['check'] else 'WRONG'}"
        )
    return "\n".join(lines)


def finite(v: Any) -> Any:
    """``v`` with every NaN or infinite float (nested in dicts, lists and tuples) replaced
    by None: JSON has no NaN (a time that was not measured is null, not a bare ``NaN``)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    if hasattr(v, "item") and hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0:
        return finite(v.item())  # a numpy scalar
    return v


def json_line(row: Dict) -> str:
    """One row as strict JSON (no NaN or Infinity tokens: they become null)."""
    return json.dumps(finite(row), allow_nan=False)


def append_json(path: str, rows: List[Dict]) -> None:
    """Append each row to the file ``path`` as one JSON line (strict JSON: :func:`json_line`)."""
    lines = [json_line(r) + "\n" for r in rows]  # all of them or none on an error
    with open(path, "a") as f:
        f.writelines(lines)
