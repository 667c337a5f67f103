"""The import graph of pyshard/ runs one way: tools -> library -> core, with no circles.

Every module under pyshard/ is parsed with ``ast`` (no import runs): every ``import`` and
``from ... import`` anywhere in it, inside functions too, relative or absolute. The graph has
an edge from a module to each pyshard module it imports (``from pkg import name`` points at
``pkg.name`` where that is a module, else at ``pkg``). Tools are ``pyshard.bench.*``,
``pyshard.apps.*`` and ``pyshard.__main__``; everything else is the library, over the
compiled ``pyshard._core``. Checked:

- no cycle;
- no library module imports a tool module;
- no private helper crosses a module line: ``from X import _name`` where ``X.`` ``_name`` is
  not a module (private modules such as ``_core`` or ``_backend`` may be imported; promote
  the helper or move it where it is used);
- no private attribute crosses one either: ``obj._name`` where the module never defines
  ``_name`` itself (``mesh._cache`` in the executor, ``x._target``, ``module._helper``);
- the planner is pure: ``pyshard.layout`` and ``pyshard.planner`` (and ``halo_planner``), with
  everything they import, import nothing that touches MPI, the core or the settings
  (``_core``, ``_shm``, ``_backend``, ``_mpi``, ``route``, ``config``, ``mesh``, ``executor``).

Imports under ``if TYPE_CHECKING:`` are edges too: they never run, but a type annotation
naming a class of a module that imports this one is a circle all the same (halo -> array ->
halo was one), so the scan counts them and pyshard has none. A
package's ``__init__`` running before its submodules is not an edge (every package that
re-exports its submodules would be a circle). The checks run on tiny synthetic packages too,
so that they are seen to fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, FrozenSet, List, Set, Tuple

PKG_DIR = Path(__file__).resolve().parents[1] / "pyshard"
TOOLS = ("pyshard.bench", "pyshard.apps", "pyshard.__main__")

Graph = Dict[str, Set[str]]


def module_names(root: Path, package: str) -> Dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (the package ``package``); stubs
    (``.pyi``, e.g. the compiled ``_core``) count as modules without a source to parse."""
    out: Dict[str, Path] = {}
    for path in sorted(root.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi") or "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join([package, *parts])
        if path.suffix == ".py" or name not in out:
            out[name] = path
    return out


def _base(module: str, is_pkg: bool, level: int, target: str) -> str:
    """The absolute module of ``from <level dots><target> import ...`` in ``module``."""
    if level == 0:
        return target
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]  # a plain module's package
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def imports(module: str, path: Path, known: Set[str]) -> List[Tuple[str, str, int]]:
    """(imported module, imported name or "", line) of every import in ``module``'s source
    that points into ``known``; ``name`` is set for ``from X import name`` where ``name`` is
    not a module of its own."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.stem == "__init__"  # a package's own module: its relative imports start here
    out: List[Tuple[str, str, int]] = []
    for node in ast.walk(tree):  # every node: inside functions, branches, TYPE_CHECKING too
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                # the longest known prefix: "import pyshard.bench.cases" -> that module
                for k in range(len(parts), 0, -1):
                    if ".".join(parts[:k]) in known:
                        out.append((".".join(parts[:k]), "", node.lineno))
                        break
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_pkg, node.level, node.module or "")
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.append((sub, "", node.lineno))
                elif base in known:
                    out.append((base, a.name, node.lineno))
    return out


def scan(root: Path, package: str) -> Tuple[Graph, List[str]]:
    """(the module graph of the package at ``root``, private names imported across module
    lines as ``"module:line imports X._name"``)."""
    mods = module_names(root, package)
    known = set(mods)
    graph: Graph = {m: set() for m in mods}
    private = []
    for m, path in mods.items():
        if path.suffix != ".py":
            continue
        for target, name, line in imports(m, path, known):
            if target != m:
                graph[m].add(target)
            if name.startswith("_") and not name.startswith("__") and target != m:
                private.append(f"{m}:{line} imports {target}.{name}")
    return graph, private


def cycles(graph: Graph) -> List[List[str]]:
    """The strongly connected components of ``graph`` with more than one module, or one
    module importing itself: each an import circle (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def is_tool(module: str, tools: Tuple[str, ...] = TOOLS) -> bool:
    """A tool module: one of ``tools`` or inside one of those packages."""
    return any(module == t or module.startswith(t + ".") for t in tools)


def upward(graph: Graph, tools: Tuple[str, ...] = TOOLS) -> List[str]:
    """Library modules that import a tool module, as ``"library -> tool"``."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if not is_tool(m, tools)
        for t in targets
        if is_tool(t, tools)
    )


# ----------------------------------------------------------------------------- pyshard


def test_pyshard_has_no_import_cycle():
    graph, _ = scan(PKG_DIR, "pyshard")
    assert "pyshard.layout" in graph and "pyshard.bench.cli" in graph  # the scan saw it all
    assert cycles(graph) == []


def test_library_never_imports_tools():
    graph, _ = scan(PKG_DIR, "pyshard")
    assert any(is_tool(m) for m in graph) and not all(is_tool(m) for m in graph)
    assert upward(graph) == []


def test_no_private_helper_crosses_a_module_line():
    _, private = scan(PKG_DIR, "pyshard")
    assert private == []


PURE = ("pyshard.layout", "pyshard.planner", "pyshard.halo_planner", "pyshard.blocks")
IMPURE = {"pyshard._core", "pyshard._shm", "pyshard._backend", "pyshard._mpi", "pyshard.route",
          "pyshard.config", "pyshard.mesh", "pyshard.executor", "pyshard.geometry",
          "pyshard.explain"}


def reach(graph: Graph, start: Tuple[str, ...]) -> Set[str]:
    """Every module ``start`` imports, directly or through others (``start`` included)."""
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_the_planner_imports_nothing_that_touches_mpi():
    graph, _ = scan(PKG_DIR, "pyshard")
    assert all(m in graph for m in PURE) and IMPURE <= set(graph)  # the scan saw them
    assert sorted(reach(graph, PURE) & IMPURE) == []
    # and it would see one: the executor side does reach the core
    assert "pyshard._core" in reach(graph, ("pyshard.geometry",))


# calls that make a fresh mutable container (a module-level one is a table others can fill)
MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter",
                 "ChainMap", "deque", "SimpleNamespace", "WeakSet", "WeakKeyDictionary",
                 "WeakValueDictionary"}
SETTER_PREFIXES = ("set_", "register", "install", "hook", "add_hook")
DYNAMIC_IMPORTS = {"importlib", "import_module", "__import__", "sys.modules"}


def _module_level(body: List[ast.stmt]) -> List[ast.stmt]:
    """The statements of a module body that run at import, into branches and class bodies,
    not into functions."""
    out: List[ast.stmt] = []
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(n)
            continue
        out.append(n)
        for field in ("body", "orelse", "finalbody", "handlers"):
            out.extend(_module_level(getattr(n, field, [])))
    return out


def _mutable(value: object) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) in MUTABLE_CALLS
    return False


def _names(node: ast.expr, alias: Set[str]) -> bool:
    """Is ``node`` (``plan``, ``pkg.plan.table``, ``plan.table["k"]``) a pure module or a
    part of one, ``alias`` being the names that this module binds to pure modules?"""
    parts = ast.unparse(node).split("[")[0].split(".")
    return any(".".join(parts[:k]) in alias for k in range(1, len(parts) + 1))


def hook_tables(root: Path, package: str, pure: Tuple[str, ...]) -> List[str]:
    """How another module could fill in part of a pure module at run time, where the import
    graph does not see it (a table of callbacks the executor side installs at import):

    - in each module of ``pure``: a module-level function named ``set_*``, ``register*``,
      ``install*`` or ``hook*``; a mutable container bound at module or class level (a dict,
      list or set display or comprehension, or ``dict()``, ``defaultdict()``, ...;
      ``__all__`` aside); a ``global`` statement; a dynamic import (``importlib``,
      ``__import__``, ``sys.modules``);
    - in every module of the package: an attribute of a pure module assigned, deleted or
      set with ``setattr`` (``plan.rule = f``)."""
    mods = module_names(root, package)
    out: List[str] = []
    for m, path in mods.items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if m in pure:
            for n in _module_level(tree.body):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if n.name.startswith(SETTER_PREFIXES):
                        out.append(f"{m}:{n.lineno}: setter {n.name}")
                    continue
                if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and _mutable(n.value):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    names = [ast.unparse(t) for t in targets]
                    if names != ["__all__"]:
                        out.append(f"{m}:{n.lineno}: mutable {', '.join(names)}")
            for n in ast.walk(tree):
                if isinstance(n, ast.Global):
                    out.append(f"{m}:{n.lineno}: global {', '.join(n.names)}")
                elif isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) in DYNAMIC_IMPORTS:
                    out.append(f"{m}:{n.lineno}: dynamic import {ast.unparse(n)}")
                elif isinstance(n, ast.Import) and any(a.name == "importlib" for a in n.names):
                    out.append(f"{m}:{n.lineno}: dynamic import importlib")
        # the names this module binds to a pure module
        alias = set(pure)
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                alias.update(a.asname for a in n.names if a.name in pure and a.asname)
            elif isinstance(n, ast.ImportFrom):
                base = _base(m, path.stem == "__init__", n.level, n.module or "")
                alias.update(a.asname or a.name for a in n.names if f"{base}.{a.name}" in pure)
        for n in ast.walk(tree):
            if (isinstance(n, (ast.Attribute, ast.Subscript))
                    and isinstance(n.ctx, (ast.Store, ast.Del)) and _names(n.value, alias)):
                out.append(f"{m}:{n.lineno}: sets {ast.unparse(n)}")
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id in ("setattr", "delattr") and n.args
                  and _names(n.args[0], alias)):
                out.append(f"{m}:{n.lineno}: sets {ast.unparse(n)}")
    return sorted(out)


def test_the_planner_holds_no_hook_table():
    """plan, layout and halo_plan compute everything they report themselves: nothing the
    executor side installs at import (the import graph above cannot see a callback table)."""
    found = hook_tables(PKG_DIR, "pyshard", PURE)
    assert not found, "the planner must not be filled in from outside:\n" + "\n".join(found)


def test_hook_table_check_fails_where_it_should(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            # a planner whose rules the executor side installs (plan.py with set_core_rules)
            "plan.py": "from typing import Any, Dict\n\n"
            "_rules: Dict[str, Any] = {'workspace': None}\n\n"
            "def set_core_rules(workspace):\n    _rules.update(workspace=workspace)\n\n"
            "def peak(s):\n    return _rules['workspace'](s)\n",
            "layout.py": "import importlib\n\nclass L:\n    hooks = list()\n\n"
            "    def core(self):\n        global CORE\n"
            "        CORE = importlib.import_module('pkg._core')\n",
            "geometry.py": "from . import plan\nfrom .plan import set_core_rules\n"
            "import pkg.layout as lay\n\nset_core_rules(len)\nplan.extra = len\n"
            "setattr(lay, 'x', 1)\nlay.L.hooks[0] = len\nimport pkg.plan\n"
            "pkg.plan.other = len\n",
            # what stays allowed: __all__, tuples, constants, containers inside functions
            "clean.py": "__all__ = ['f']\nRULES = ('a', 'b')\n\ndef f():\n"
            "    cache = {}\n    return cache\n",
        },
    )
    assert hook_tables(root, "pkg", ("pkg.plan", "pkg.layout", "pkg.clean")) == [
        "pkg.geometry:10: sets pkg.plan.other",
        "pkg.geometry:6: sets plan.extra",
        "pkg.geometry:7: sets setattr(lay, 'x', 1)",
        "pkg.geometry:8: sets lay.L.hooks[0]",
        "pkg.layout:1: dynamic import importlib",
        "pkg.layout:4: mutable hooks",
        "pkg.layout:7: global CORE",
        "pkg.layout:8: dynamic import importlib",
        "pkg.plan:3: mutable _rules",
        "pkg.plan:5: setter set_core_rules",
    ]


# ----------------------------------------------------------------------------- the checks fail


def _package(tmp_path: Path, files: Dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_cycle_finder_on_a_tiny_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_checks_catch_a_function_level_cycle_an_upward_import_and_a_private_name(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "from .core import thing\n",
            "core.py": "def thing():\n    from .tools.run import go\n    return go\n",
            "_low.py": "def _helper():\n    pass\n",
            "mid.py": "from . import _low\nfrom ._low import _helper\n",
            "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from .core import thing\nelse:\n    from . import mid\n",
            "tools/__init__.py": "",
            "tools/run.py": "import pkg.core\nfrom .. import mid\n\ndef go():\n    pass\n",
        },
    )
    graph, private = scan(root, "pkg")
    assert graph["pkg.core"] == {"pkg.tools.run"}  # found inside a function
    assert graph["pkg.tools.run"] == {"pkg.core", "pkg.mid"}  # absolute and relative
    assert graph["pkg.mid"] == {"pkg._low"}
    assert graph["pkg.typed"] == {"pkg.core", "pkg.mid"}  # a TYPE_CHECKING import counts
    assert cycles(graph) == [["pkg.core", "pkg.tools.run"]]
    assert sorted(reach(graph, ("pkg.mid",))) == ["pkg._low", "pkg.mid"]
    assert "pkg.tools.run" in reach(graph, ("pkg.typed",))
    assert upward(graph, ("pkg.tools",)) == ["pkg.core -> pkg.tools.run"]
    assert private == ["pkg.mid:2 imports pkg._low._helper"]  # the module _low itself is fine


# modules outside pyshard whose private names pyshard may use (the standard library's
# documented ones)
FOREIGN_PRIVATE = {"os._exit"}


def private_attributes(root: Path) -> List[str]:
    """``X._name`` in a module where ``_name`` is not one of that module's own names (defined,
    assigned as an attribute, or listed in ``__slots__``) and ``X`` is not ``self``/``cls``:
    another module's private state or helper reached by attribute (``mesh._cache``,
    ``x._target``, ``module._helper``), which ``from X import _name`` does not catch."""
    out: List[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own: Set[str] = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                own.add(n.value)  # __slots__ entries
        for n in ast.walk(tree):
            if not isinstance(n, ast.Attribute) or not n.attr.startswith("_"):
                continue
            if n.attr.startswith("__") or n.attr in own:
                continue
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
            text = ast.unparse(n)
            if text not in FOREIGN_PRIVATE:
                out.append(f"{path.relative_to(root.parent)}:{n.lineno}: {text}")
    return out


def test_no_private_attribute_crosses_a_module_line():
    found = private_attributes(PKG_DIR)
    assert not found, "promote to a public name of the module that owns it:\n" + "\n".join(found)


def test_private_attribute_check_fails_where_it_should(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "mesh.py": "class Mesh:\n    __slots__ = ('_cache',)\n\n    def __init__(self):\n"
            "        self._cache = {}\n        self._own = 1\n\n    def peek(self, o):\n"
            "        return o._cache, self._own\n",
            "user.py": "import os\nfrom . import mesh\n\ndef go(m):\n"
            "    os._exit(0)\n    return m._cache, mesh._helper(), m._pending\n",
        },
    )
    assert sorted(private_attributes(root)) == [
        "pkg/user.py:6: m._cache", "pkg/user.py:6: m._pending", "pkg/user.py:6: mesh._helper",
    ]  # fmt: skip


# ----------------------------------------------------------------------------- tests' reach

TESTS_DIR = Path(__file__).resolve().parent

# Unit tests of private modules' own logic, by file (named from the tests folder's parent), and
# the private modules each may import and use the public names of (their private names stay
# out of reach). Every other test goes through pyshard's public API (comm_stats,
# large_count_stats, validation_stats, result_pool_bytes, build_info, config, memory, ...).
UNIT_TESTS: Dict[str, FrozenSet[str]] = {
    # The compiled core is a layer with its own checked interface: pyshard/_core.pyi, generated
    # from the build and compared with it by tests/test_stubs.py. Its own unit tests:
    "tests/test_core.py": frozenset({"_core"}),
    "tests/test_kernels_on_host.py": frozenset({"_core"}),
    "tests/test_stubs.py": frozenset({"_core"}),
    # The import-time checks (_mpi: which MPI library the core and mpi4py load, the messages
    # when they differ or the core does not load), run on the core's build facts and strings
    # that stand for other MPI libraries; nothing of it is API beyond build_info().
    "tests/test_import.py": frozenset({"_core", "_mpi"}),
    # The CUDA path's dtype casts (_dtypes.widen/narrow) checked on the host against
    # ml_dtypes, DLPack's dtype codes read from capsules (_backend.dltype), and the lazy
    # imports of ml_dtypes and cupy set to "not installed": internals with no public face.
    "tests/test_dtypes.py": frozenset({"_backend", "_dtypes"}),
    # The core's CUDA handler for pyshard.jax counts its calls that overlap (two steps in
    # flight at once in one process): a fact of the core's FFI handler, read on the GPU only.
    "tests/gpu/test_jax_gpu.py": frozenset({"_core"}),
    # A fault only the core can place: a rank stopped inside a node-shared handshake, between
    # its writes and its arrivals (the core's tests-only stall_next_arrival); its peer's
    # timeout must name it (test_faults.py).
    "tests/mpi/peer_worker.py": frozenset({"_core"}),
}

# calls that reach an attribute by name: X.<name>(obj, "attribute", ...) or <name>(obj, ...)
NAMED_ATTRIBUTE_CALLS = {"setattr", "getattr", "delattr", "hasattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _hidden(parts: List[str], ok: FrozenSet[str]) -> bool:
    """Does the dotted path ``parts`` (``pyshard._mod.name``) name something private, other
    than a module of ``ok`` right under the package?"""
    return any(_private(p) and not (i == 1 and p in ok) for i, p in enumerate(parts))


def private_reach(tests: Path, package: str = "pyshard") -> List[str]:
    """Every place a test reaches past the public API of ``package``: an import of a private
    module or name of it (``from pyshard import _core``, ``from pyshard.many import _Fused``),
    an attribute ``X._name`` that no file under ``tests`` defines itself (a test's own
    helpers may be private; ``os._exit``, ``self``/``cls`` and dunders are fine), or the same
    by string: ``setattr``/``getattr``/``delattr``/``hasattr`` (built in or
    ``monkeypatch.setattr``/``delattr``) of ``X, "_name"`` or ``"pyshard._mod.name"``. The files
    of :data:`UNIT_TESTS` may import their private modules and use their public names."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
             for p in sorted(tests.rglob("*.py"))}
    own: Set[str] = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
    out: List[str] = []
    for path, tree in trees.items():
        where = f"{path.relative_to(tests.parent)}"
        ok = UNIT_TESTS.get(where, frozenset())

        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package:
                mod = n.module or ""
                names = [a.name for a in n.names]
                if _hidden(mod.split("."), ok):
                    out.append(f"{where}:{n.lineno}: from {mod} import {', '.join(names)}")
                out += [f"{where}:{n.lineno}: from {mod} import {a}" for a in names
                        if _private(a) and not (mod == package and a in ok)]
            elif isinstance(n, ast.Import):
                out += [f"{where}:{n.lineno}: import {a.name}" for a in n.names
                        if a.name.split(".")[0] == package and _hidden(a.name.split("."), ok)]
            elif isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in own:
                if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                    continue
                if n.attr in ok:
                    continue
                text = ast.unparse(n)
                if text not in FOREIGN_PRIVATE:
                    out.append(f"{where}:{n.lineno}: {text}")
            elif isinstance(n, ast.Call) and n.args and (
                (isinstance(n.func, ast.Name) and n.func.id in NAMED_ATTRIBUTE_CALLS)
                or (isinstance(n.func, ast.Attribute) and n.func.attr in ("setattr", "delattr"))
            ):
                first, name = n.args[0], n.args[1] if len(n.args) > 1 else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    parts = first.value.split(".")  # monkeypatch.setattr("pkg.mod.name", v)
                    if parts[0] == package and _hidden(parts, ok):
                        out.append(f"{where}:{n.lineno}: {ast.unparse(n.func)}({first.value!r})")
                    continue
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    continue
                if not _private(name.value) or name.value in own or name.value in ok:
                    continue
                if isinstance(first, ast.Name) and first.id in ("self", "cls"):
                    continue
                out.append(f"{where}:{n.lineno}: {ast.unparse(first)}.{name.value} "
                           f"(by {ast.unparse(n.func)})")
    return out


def test_tests_reach_no_private_names():
    found = private_reach(TESTS_DIR)
    assert found == [], (
        f"{len(found)} private reaches from tests; test through public names, settings or "
        "documented arguments (or, for a unit test of a private module's own logic, name it in "
        "UNIT_TESTS with the reason):\n" + "\n".join(found))


def test_private_reach_finds_imports_and_attributes(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "helpers.py").write_text("def _mine():\n    pass\n")
    (tests / "test_x.py").write_text(
        "import os\nimport pyshard._core\nfrom pyshard import _shm, Mesh\n"
        "from pyshard.many import _Fused, redistribute_many\nfrom . import helpers\n\n"
        "def test(h, mesh):\n    os._exit(0)\n    helpers._mine()\n"
        "    return h._buf, mesh.__class__, mesh.size\n")
    assert sorted(private_reach(tests)) == [
        "tests/test_x.py:10: h._buf", "tests/test_x.py:2: import pyshard._core",
        "tests/test_x.py:3: from pyshard import _shm",
        "tests/test_x.py:4: from pyshard.many import _Fused",
    ]  # fmt: skip


def test_private_reach_finds_reaches_by_string(tmp_path):
    """setattr/getattr/delattr/hasattr and monkeypatch's, by attribute name or dotted path;
    dunders, a test's own names, ``self`` and names that are not private pass."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_y.py").write_text(
        "import pyshard as ps\nfrom pyshard.fft import engine\n\n"
        "def test(monkeypatch, mesh):\n"
        "    monkeypatch.setattr(engine, '_sfft', None)\n"
        "    monkeypatch.delattr(ps.Mesh, '_cache')\n"
        "    monkeypatch.setattr('pyshard._shm.node', None)\n"
        "    monkeypatch.setattr('pyshard.fft.engine._PYFFTW', False)\n"
        "    getattr(mesh, '_migrate_state', {})\n"
        "    setattr(ps, '_warned', True)\n"
        "    hasattr(mesh, '_node_map')\n"
        "    monkeypatch.setattr(ps.Layout, '__init__', None)\n"
        "    monkeypatch.setattr('pyshard.fft.engine.backend', None)\n"
        "    monkeypatch.setattr('builtins.open', None)\n"
        "    monkeypatch.setattr(engine, 'backend', None)\n"
        "    setattr(self, '_mine', 1)\n"
        "    getattr(mesh, '_own', None)\n\n"
        "class T:\n    _own = 1\n")
    assert sorted(private_reach(tests)) == [
        "tests/test_y.py:10: ps._warned (by setattr)",
        "tests/test_y.py:11: mesh._node_map (by hasattr)",
        "tests/test_y.py:5: engine._sfft (by monkeypatch.setattr)",
        "tests/test_y.py:6: ps.Mesh._cache (by monkeypatch.delattr)",
        "tests/test_y.py:7: monkeypatch.setattr('pyshard._shm.node')",
        "tests/test_y.py:8: monkeypatch.setattr('pyshard.fft.engine._PYFFTW')",
        "tests/test_y.py:9: mesh._migrate_state (by getattr)",
    ]  # fmt: skip


def test_private_reach_lets_unit_tests_import_their_private_modules(tmp_path):
    """test_core.py may import the core (not _shm); test_import.py the core and _mpi but not
    _mpi's private names; any other test none of them."""
    tests = tmp_path / "tests"
    tests.mkdir()
    text = ("import pyshard\nimport pyshard._core\nfrom pyshard import _core, _shm\n\n"
            "def test():\n    return pyshard._core, _core.stats\n")
    for name in ("test_core.py", "test_other.py"):
        (tests / name).write_text(text)
    (tests / "test_import.py").write_text(
        "from pyshard import _mpi\nfrom pyshard._mpi import clean, _NAMES\n\n"
        "def test(monkeypatch):\n    monkeypatch.setattr(_mpi, 'mpi4py_library', None)\n"
        "    monkeypatch.setattr(_mpi, '_MARKER', b'')\n    return _mpi._NAMES\n")
    assert sorted(private_reach(tests)) == [
        "tests/test_core.py:3: from pyshard import _shm",
        "tests/test_import.py:2: from pyshard._mpi import _NAMES",
        "tests/test_import.py:6: _mpi._MARKER (by monkeypatch.setattr)",
        "tests/test_import.py:7: _mpi._NAMES",
        "tests/test_other.py:2: import pyshard._core",
        "tests/test_other.py:3: from pyshard import _core",
        "tests/test_other.py:3: from pyshard import _shm",
        "tests/test_other.py:6: pyshard._core",
    ]  # fmt: skip


# ----------------------------------------------------------------------------- Python's MPI calls

MPI4PY_COLLECTIVES = {
    "allgather", "Allgather", "Allgatherv", "allreduce", "Allreduce", "alltoall", "Alltoall",
    "Alltoallv", "barrier", "Barrier", "bcast", "Bcast", "gather", "Gather", "Gatherv",
    "reduce", "Reduce", "Reduce_scatter", "scatter", "Scatter", "scan", "Scan", "exscan",
    "Exscan", "Iallreduce", "Ibarrier", "Ibcast",
}


OWN_RECEIVERS = ("collectives", "plan", "self")


def python_collectives(root: Path, package: str, home: str) -> List[str]:
    """Calls ``X.<an mpi4py collective>(...)`` in the library modules of ``package`` other
    than ``home`` (the one module that makes them); tools may call mpi4py as they like. A
    receiver named ``plan`` or ``self`` is pyshard's own (:class:`pyshard.GatherPlan`'s
    ``gather`` and ``scatter``), not a communicator."""
    out: List[str] = []
    for name, path in module_names(root, package).items():
        if path.suffix != ".py" or name == home or is_tool(name, tuple(
                t.replace("pyshard", package, 1) for t in TOOLS)):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in MPI4PY_COLLECTIVES
                    and ast.unparse(n.func.value).split(".")[-1] not in OWN_RECEIVERS):
                out.append(f"{name}:{n.lineno}: {ast.unparse(n.func)}")
    return out


def test_python_collectives_only_in_their_module():
    found = python_collectives(PKG_DIR, "pyshard", "pyshard.collectives")
    assert not found, "call these through pyshard.collectives:\n" + "\n".join(found)


def test_python_collectives_check_fails_where_it_should(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "collectives.py": "def barrier(comm):\n    comm.Barrier()\n",
            "lib.py": "from . import collectives\n\ndef go(comm, mesh, plan):\n"
            "    comm.allgather(1)\n    mesh.comm.Allreduce(1, 2)\n"
            "    collectives.barrier(comm)\n    plan.gather(1)\n",
            "bench/__init__.py": "",
            "bench/run.py": "def go(comm):\n    comm.Barrier()\n",
        },
    )
    assert python_collectives(root, "pkg", "pkg.collectives") == [
        "pkg.lib:4: comm.allgather", "pkg.lib:5: mesh.comm.Allreduce",
    ]  # fmt: skip


# ----------------------------------------------------------------------------- the core's MPI calls

CPP_DIR = PKG_DIR.parent / "cpp"


def cpp_calls(cpp: Path, call: re.Pattern[str], skip: Tuple[str, ...]) -> List[str]:
    """``path:line: name`` of every match of ``call`` (group 1: the name) in the core's
    sources but those whose stem is in ``skip`` (comments and string literals left out)."""
    noise = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)
    out: List[str] = []
    for path in sorted(cpp.rglob("*")):
        if path.suffix not in (".cpp", ".h", ".cu", ".cuh", ".hpp") or path.stem in skip:
            continue
        # blank out comments and strings, keeping line breaks so line numbers hold
        text = noise.sub(lambda m: re.sub(r"[^\n]", " ", m.group()),
                         path.read_text(encoding="utf-8"))
        for m in call.finditer(text):
            out.append(f"{path.relative_to(cpp.parent)}:{text.count(chr(10), 0, m.start()) + 1}: "
                       f"{m.group(1)}")
    return out


def raw_mpi_calls(cpp: Path) -> List[str]:
    """Calls ``MPI_Name(...)`` (and ``PMPI_``, ``MPIX_``) in the core's sources outside
    cpp/mpi_calls.{h,cpp}, the one place the core calls MPI (comments and string literals
    left out; constants, types and handles are not calls)."""
    return cpp_calls(cpp, re.compile(r"\b(P?MPIX?_[A-Z][A-Za-z0-9_]*)\s*\("), ("mpi_calls",))


def test_the_core_calls_mpi_only_in_mpi_calls(tmp_path):
    found = raw_mpi_calls(CPP_DIR)
    assert not found, "call MPI through cpp/mpi_calls.{h,cpp}:\n" + "\n".join(found)
    # and the check fails where it should: one raw call put back into a copy of migrate.cpp
    cpp = tmp_path / "cpp"
    cpp.mkdir()
    for name in ("mpi_calls.h", "mpi_calls.cpp", "migrate.cpp"):
        (cpp / name).write_text((CPP_DIR / name).read_text(encoding="utf-8"), encoding="utf-8")
    with (cpp / "migrate.cpp").open("a", encoding="utf-8") as f:
        f.write('// MPI_Barrier(comm) in a comment\nconst char* s = "MPI_Barrier(comm)";\n'
                "void f(MPI_Request* r) {\n  MPI_Startall (2, r);\n}\n")
    lines = (cpp / "migrate.cpp").read_text(encoding="utf-8").count("\n")
    assert raw_mpi_calls(cpp) == [f"cpp/migrate.cpp:{lines - 1}: MPI_Startall"]


# The point-to-point transport: every message an operation sends or receives is posted by
# cpp/peer_messages.cpp (PeerMessages: p2p, persistent, neighbor), not by each operation.
P2P_POSTS = ("isend", "irecv", "isend_typed", "irecv_typed", "send_init", "recv_init",
             "send_init_typed", "recv_init_typed", "start", "startall", "waitany",
             "ineighbor_alltoallv", "neighbor_alltoallv_init", "dist_graph")


def message_posts(cpp: Path) -> List[str]:
    """Calls ``mpi::<post>(`` of :data:`P2P_POSTS` outside cpp/peer_messages.cpp and
    cpp/mpi_calls (comments and string literals left out)."""
    call = re.compile(r"\b(mpi::(?:" + "|".join(P2P_POSTS) + r"))\s*\(")
    return cpp_calls(cpp, call, ("mpi_calls", "peer_messages"))


def test_messages_are_posted_only_by_the_transport(tmp_path):
    found = message_posts(CPP_DIR)
    assert not found, "post messages through PeerMessages (cpp/peer_messages.h):\n" + \
        "\n".join(found)  # fmt: skip
    # and the check fails where it should: a halo that posts its own receive again
    cpp = tmp_path / "cpp"
    cpp.mkdir()
    for name in ("peer_messages.cpp", "halo.cpp"):
        (cpp / name).write_text((CPP_DIR / name).read_text(encoding="utf-8"), encoding="utf-8")
    with (cpp / "halo.cpp").open("a", encoding="utf-8") as f:
        f.write("// mpi::irecv(p, n) in a comment\n"
                "void f(char* p, MPI_Request* r) { mpi::irecv (p, 1, 0, 0, c, r); }\n")
    lines = (cpp / "halo.cpp").read_text(encoding="utf-8").count("\n")
    assert message_posts(cpp) == [f"cpp/halo.cpp:{lines}: mpi::irecv"]
