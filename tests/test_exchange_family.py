"""One exchange family (pyshard.exchange): every core step that moves bytes between ranks is
built by a member of it, in the modules of the operations that run it; every operation in
flight is a Request.

Checked on the source with ``ast`` (no import runs), on tiny synthetic packages (so the checks
are seen to fail), and on live objects at one rank.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

import numpy as np
from test_structure import module_names

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.exchange import Exchange, Request

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pyshard"
# the operations and the modules that build their exchanges
FAMILY = {"pyshard.executor", "pyshard.many", "pyshard.halo", "pyshard.migration",
          "pyshard.unstructured"}


def core_steps(stub: Path) -> Set[str]:
    """The core's classes that move bytes between ranks (from the checked stub): its steps
    and the rows' exchange."""
    names = set(re.findall(r"^class (\w+)", stub.read_text(), re.M))
    return {n for n in names if n.endswith("Step") or n in ("MigrateExchange", "IndexExchange")}


def step_builders(root: Path, package: str, steps: Set[str]) -> Dict[str, List[str]]:
    """Module -> the core steps it constructs (``_core.<Step>(...)`` calls)."""
    out: Dict[str, List[str]] = {}
    for name, path in module_names(root, package).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in steps and ast.unparse(n.func.value).endswith("_core")):
                out.setdefault(name, []).append(n.func.attr)
    return out


def exchange_classes(path: Path) -> List[str]:
    """Classes of a module that derive from ``Exchange`` (directly, or from one that does in
    the same module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    members: List[str] = []
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            bases = {ast.unparse(b).split(".")[-1] for b in n.bases}
            if "Exchange" in bases or bases & set(members):
                members.append(n.name)
    return members


def family_violations(root: Path, package: str, family: Set[str], steps: Set[str]) -> List[str]:
    found = []
    paths = module_names(root, package)
    for mod, built in sorted(step_builders(root, package, steps).items()):
        if mod not in family:
            found.append(f"{mod} builds {sorted(set(built))} outside the exchange family")
    for mod in sorted(family):
        if mod in paths and not exchange_classes(paths[mod]):
            found.append(f"{mod} runs exchanges but defines no Exchange")
    return found


def test_every_core_step_is_built_by_the_exchange_family():
    steps = core_steps(PKG / "_core.pyi")
    assert {"ExchangeStep", "FusedExchangeStep", "HaloStep", "ShmHaloStep",
            "MigrateExchange", "IndexExchange"} <= steps  # the stub names them
    built = step_builders(PKG, "pyshard", steps)
    assert set(built) == FAMILY, built  # each operation builds its own, and only they do
    assert family_violations(PKG, "pyshard", FAMILY, steps) == []
    assert exchange_classes(PKG / "many.py") == ["FusedExchange", "ShmFusedExchange"]
    assert "HaloExchange" in exchange_classes(PKG / "halo.py")
    assert "RowExchange" in exchange_classes(PKG / "migration.py")
    assert "IndexExchange" in exchange_classes(PKG / "unstructured.py")


def test_the_family_check_fails_where_it_should(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "ops.py").write_text(
        "from . import _core\nfrom .exchange import Exchange\n\n"
        "class Mine(Exchange):\n    pass\n\nclass More(Mine):\n    pass\n\n"
        "def go(c):\n    return Mine('op', None, _core.HaloStep(c))\n")
    (root / "stray.py").write_text("from . import _core\n\ndef go(c):\n"
                                   "    return _core.ExchangeStep(c), _core.Other(c)\n")
    (root / "bare.py").write_text("def go():\n    pass\n")
    steps = {"HaloStep", "ExchangeStep"}
    assert exchange_classes(root / "ops.py") == ["Mine", "More"]
    assert family_violations(root, "pkg", {"pkg.ops", "pkg.bare"}, steps) == [
        "pkg.stray builds ['ExchangeStep'] outside the exchange family",
        "pkg.bare runs exchanges but defines no Exchange",
    ]  # fmt: skip


def test_live_operations_run_exchanges_and_return_requests():
    """At one rank (every operation still binds its exchange): a redistribute's steps, a
    batch, a halo update and fold, a migration and its way back, a gather plan."""
    from mpi4py import MPI

    from pyshard.executor import executors

    mesh = ps.Mesh(MPI.COMM_SELF, (1,))
    try:
        g = np.arange(48, dtype=np.float64).reshape(6, 8)
        x = ps.distribute(g, mesh, [Shard(0)])
        p = x.plan_to([Replicate()])
        for e in executors(p, mesh):
            assert isinstance(e, Exchange) and e.op == "redistribute"
            assert e.explain().startswith("redistribute: path ")
        pend = x.redistribute([Shard(1)], wait=False)
        assert isinstance(pend, Request) and pend.test() and pend.done
        np.testing.assert_array_equal(pend.wait().local, g)
        h = x.with_halo(1, periodic=True)
        assert h.exchange is None  # built by the first update
        h.update()
        h.fold()
        assert isinstance(h.exchange, Exchange) and h.exchange.op == "halo"
        assert isinstance(h.fold_exchange, Exchange) and h.fold_exchange.op == "fold"
        assert h.exchange.route is h.route
        rows = np.arange(5.0)
        mp = ps.migrate(rows, np.zeros(5, np.int64), mesh, wait=False)
        assert isinstance(mp, Request) and not mp.done and mp.test() and mp.done
        r = mp.wait()
        back = r.back(r.rows, wait=False)
        assert isinstance(back, Request)
        np.testing.assert_array_equal(back.wait(), rows)
        plan = ps.gather_plan([4, 0, 4], like=x)
        assert isinstance(plan.exchange, Exchange) and plan.exchange.op == "gather"
        gp = plan.gather(x, wait=False)
        assert isinstance(gp, Request) and gp.test()
        np.testing.assert_array_equal(gp.wait(), g[[4, 0, 4]])
    finally:
        mesh.free()
