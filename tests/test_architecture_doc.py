"""docs/architecture.md's table of library layers is the import graph: every top-level library
module is in it, and each builds on exactly the modules the table names beyond the base."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Set

from test_structure import PKG_DIR, is_tool, scan

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def layers(text: str) -> tuple[Set[str], Dict[str, Set[str]]]:
    """The base and the table of "### Library layers": module -> what it builds on."""
    sec = text.split("### Library layers", 1)[1].split("\n#", 1)[0]
    base_text = sec.split("(which import only", 1)[0]
    base = set(re.findall(r"`(\w+)`", base_text))
    table: Dict[str, Set[str]] = {}
    for line in sec.splitlines():
        m = re.match(r"\| `(\w+)` \|(.*)\|\s*$", line)
        if m:
            table[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    return base, table


def library_graph() -> Dict[str, Set[str]]:
    """Top-level library module -> the top-level pyshard modules it imports (packages: their
    own name)."""
    graph, _ = scan(PKG_DIR, "pyshard")
    out: Dict[str, Set[str]] = {}
    for m, deps in graph.items():
        parts = m.split(".")
        if len(parts) != 2 or is_tool(m):
            continue
        out[parts[1]] = {d.split(".")[1] for d in deps if d.count(".") >= 1} - {parts[1]}
    return out


def mismatches(base: Set[str], table: Dict[str, Set[str]], graph: Dict[str, Set[str]]) -> list:
    out = []
    packages = {"fft", "checkpoint", "jax"}  # their own rooms (the rooms table)
    for m in sorted(set(graph) - base - packages - set(table)):
        out.append(f"{m}: not in the table")
    for m in sorted(set(table) - set(graph)):
        out.append(f"{m}: in the table, not a module")
    for m in sorted(base & set(graph)):
        extra = graph[m] - base
        if extra:
            out.append(f"{m} (base) imports {sorted(extra)}")
    for m, said in sorted(table.items()):
        if m not in graph:
            continue
        real = graph[m] - base
        if real - said:
            out.append(f"{m}: builds on {sorted(real - said)}, which the table does not name")
        if said - real:
            out.append(f"{m}: the table names {sorted(said - real)}, which it does not import")
    return out


def test_the_layer_table_is_the_import_graph():
    base, table = layers(DOC.read_text())
    assert {"config", "_core", "layout"} <= base and {"executor", "halo", "migration"} <= set(table)
    assert mismatches(base, table, library_graph()) == []


def test_the_layer_check_fails_where_it_should():
    base = {"config"}
    table = {"a": {"b"}, "b": set(), "gone": set()}
    graph = {"config": {"a"}, "a": {"config", "c"}, "b": {"a"}, "c": set()}
    assert mismatches(base, table, graph) == [
        "c: not in the table", "gone: in the table, not a module",
        "config (base) imports ['a']",
        "a: builds on ['c'], which the table does not name",
        "a: the table names ['b'], which it does not import",
        "b: builds on ['a'], which the table does not name",
    ]  # fmt: skip
