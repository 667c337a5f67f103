"""``python -m pyshard doctor``: what this job's machines give pyshard, and what to change.

Run it the way the job runs (``mpiexec -n N python -m pyshard doctor``, or ``srun``): every
rank reports what it sees (its CPUs, thread settings, ``malloc``, huge pages, whether node peers
may write into it), one ``MPI_Allgather`` brings that to rank 0, and a mesh over all ranks
says what the node transport can do. Rank 0 prints one block per node and a list of hints,
each naming the setting or the page of the docs that fixes it (the command line is in
``pyshard/__main__.py``). Nothing is timed and nothing
is changed (beyond what building a mesh does: docs/performance.md, cross-memory attach).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _mpi, collectives, config
from ._backend import build_info, malloc_name

__all__ = ["rank_facts", "report"]

_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
_THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _chosen(text: Optional[str]) -> Optional[str]:
    """The bracketed choice of a sysfs list (``always [madvise] never`` -> ``madvise``)."""
    if text is None:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text


def rank_facts() -> Dict[str, Any]:
    """What this rank sees of its machine and process, with no MPI call: ``host``, ``pid``,
    ``cpus`` (the CPUs this process may run on: its affinity, where a launcher binds ranks),
    ``threads`` (the thread-count variables that are set), ``malloc``, ``thp`` and
    ``thp_shmem`` (transparent huge pages for private and shared memory), ``ptrace_scope``
    (Yama's, or None), ``settings`` (the ``PYSHARD_*`` settings whose value is not the
    default), ``mpi`` (the MPI library mpi4py runs), ``core_mpi`` (the one pyshard's core
    runs), ``core_built`` (whose ``mpi.h`` it was built with), ``version`` (pyshard's), and
    the CUDA facts of :func:`pyshard.build_info`."""
    from . import _shm

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    scope = _read(_shm.YAMA_SCOPE)
    changed = {}
    for name, s in config.SETTINGS.items():
        try:
            value = config.get(name)
        except ValueError as e:  # a bad value in this rank's environment: reported, so that
            # every rank still reaches the gather; under the variable that holds it
            if not config.own_error(name, e):
                continue
            value = f"invalid: {e}"
        if value != s.default:
            changed[name] = value
    with config.override(**dict.fromkeys(k for k, v in changed.items() if _invalid(v))):
        info = build_info()  # (on the defaults of the refused: it reads the transports)
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpus": cpus,
        "threads": {v: os.environ[v] for v in config.THREAD_VARIABLES if os.environ.get(v)},
        "malloc": malloc_name(),
        "thp": _chosen(_read(_THP)),
        "thp_shmem": _chosen(_read(_THP_SHMEM)),
        "ptrace_scope": int(scope) if scope is not None and scope.isdigit() else None,
        "settings": changed,
        "mpi": _mpi.library_name(_mpi.library_line()),
        "core_mpi": info.get("mpi_library"),
        "core_built": info.get("mpi"),
        "version": info.get("version"),
        "cuda": info.get("cuda"),
        "cuda_device": info.get("cuda_device"),
        "cuda_aware_mpi": info.get("cuda_aware_mpi"),
    }


_UNSET = object()  # a setting at its default (absent from a rank's changed settings)


def _ranks(rs: List[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out: List[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def report(comm: Any) -> Tuple[List[str], List[str]]:
    """Collective over ``comm`` (an mpi4py communicator): builds a 1-D mesh over it, gathers
    :func:`rank_facts` and what the node transport can do on each rank (one
    ``MPI_Allgather``), and returns (lines, hints) on every rank: one block of lines per node,
    then what to change, each hint naming its fix."""
    from .mesh import Mesh

    mine = rank_facts()
    # a value this rank refuses would raise in the mesh's build (PYSHARD_CMA, and those read
    # at import: config.check_applied): the doctor builds its mesh on their defaults, and
    # reports them among the hints
    refused = [k for k, v in mine["settings"].items() if _invalid(v)]
    with config.override(**dict.fromkeys(refused)):
        mesh = Mesh(comm, (comm.size,))
        try:
            node = mesh.node_transport((0,))
            mine["shm"] = node is not None
            mine["cma"] = bool(node is not None and node.cma)
            info = mesh.node_info()
            mine["shm_setup"] = bool(info is None or info["shm"][comm.rank])
            facts: List[Dict[str, Any]] = collectives.allgather(comm, mine)
            groups = mesh.node_groups((0,)) or {0: (0, 0)}
        finally:
            mesh.free()
    by_node: Dict[Any, List[int]] = {}
    for r in range(comm.size):
        by_node.setdefault(groups[r], []).append(r)
    f0 = facts[0]
    lines = [f"pyshard {f0['version']}: {comm.size} rank(s) on {len(by_node)} "
             f"node(s); MPI: {f0['mpi']} (mpi4py), {f0['core_mpi']} (pyshard's core, built "
             f"with {f0['core_built']}'s mpi.h)"]
    hints: List[str] = []
    per_host: Dict[str, int] = {}
    cpus: Dict[str, set] = {}  # the CPUs the ranks of a machine may run on, together
    for f in facts:
        per_host[f["host"]] = per_host.get(f["host"], 0) + 1
        cpus.setdefault(f["host"], set()).update(f["cpus"])
    for rs in by_node.values():
        f = facts[rs[0]]
        cores = len(cpus[f["host"]])
        on_host = per_host[f["host"]]
        lines.append(f"node {f['host']}: ranks {_ranks(rs)}, {cores} core(s)"
                     + (f" ({on_host} ranks on the machine)" if on_host > len(rs) else "")
                     + (" (more ranks than cores)" if on_host > cores else ""))
        if len(rs) > 1:
            state = _shm_state(facts, rs, all(facts[r]["shm"] for r in rs))
            lines.append(f"  node-shared memory: {state}")
            if state == "usable":
                lines.append("  node peers write into private results (cross-memory attach): "
                             + _cma_state(facts, rs, hints, f["host"]))
                if f["thp_shmem"] in ("never", "deny"):
                    hints.append(f"{f['host']}: shared memory gets no huge pages (shmem_enabled"
                                 f"={f['thp_shmem']}): results in node-shared memory are "
                                 "written on 4 KiB pages, transposes 15-25% slower; an "
                                 "administrator can set /sys/kernel/mm/transparent_hugepage/"
                                 "shmem_enabled to advise, which pyshard asks for "
                                 "(docs/performance.md, \"Huge pages for big host buffers\")")
        else:
            lines.append("  node-shared memory: none needed (one rank on this node)")
        lines.append(f"  transparent huge pages: {f['thp']} (private), {f['thp_shmem']} "
                     f"(shared); malloc: {f['malloc']}")
        threads = f["threads"]
        lines.append("  threads: " + (", ".join(f"{k}={v}" for k, v in threads.items())
                                      or "no OMP_NUM_THREADS (or BLAS variable) set"))
        if on_host > cores:
            hints.append(f"{f['host']}: {on_host} ranks on {cores} cores: ranks wait for each "
                         "other to be scheduled; time runs with a core per rank")
        note = config.threads_note(on_host, cores, dict(threads))
        if note:
            hints.append(f"{f['host']}: {note.removeprefix('pyshard: ')}")
        if f["thp"] == "never":
            hints.append(f"{f['host']}: transparent huge pages are off: large results fault "
                         "in 4 KiB at a time (docs/performance.md, \"Huge pages for big host "
                         "buffers\")")
    if any(f["mpi"] != f["core_mpi"] for f in facts):
        hints.append("mpi4py and pyshard's core run different MPI libraries: rebuild one "
                     "against the other (docs/site/troubleshooting.md, \"Mismatched MPI "
                     "libraries\")")
    if f0["malloc"] == "glibc" and _jax_installed():
        hints.append("pyshard.jax: glibc returns XLA's large results to the system at every "
                     "call; preload tcmalloc (LD_PRELOAD=libtcmalloc_minimal.so.4) to keep "
                     "them (docs/jax.md, \"XLA's buffers and the allocator\")")
    if f0["settings"]:
        lines.append("settings that differ from their defaults (rank 0): "
                     + ", ".join(f"{k}={v!r}" for k, v in sorted(f0["settings"].items())))
    def collective(f: Dict[str, Any]) -> Dict[str, Any]:  # (timeouts, cache sizes, attach
        # and the other settings outside config.COLLECTIVE_SETTINGS may differ between ranks)
        return {k: v for k, v in f["settings"].items() if k in config.COLLECTIVE_SETTINGS}

    other = [r for r, f in enumerate(facts) if collective(f) != collective(f0)]
    if other:  # they choose which collectives run: ranks that differ wait for each other
        c0 = collective(f0)
        names = sorted({k for r in other for k in set(collective(facts[r])) | set(c0)
                        if collective(facts[r]).get(k, _UNSET) != c0.get(k, _UNSET)})
        hints.append(f"{'rank' if len(other) == 1 else 'ranks'} {_ranks(other)} "
                     f"{'has' if len(other) == 1 else 'have'} other settings than rank 0 "
                     f"({', '.join(names)}): every rank must see the same, or collectives can "
                     f"hang or return wrong results")
    bad = sorted({k for f in facts for k, v in f["settings"].items() if _invalid(v)})
    if bad:
        hints.append(f"settings with a value pyshard refuses: {', '.join(bad)} (the first call "
                     "that reads one raises: a setting of a path the job never takes, the GPU's "
                     "or a checkpoint format's, never raises; one read at import: the first "
                     "Mesh's build)")
    if f0["cuda"]:
        lines.append(f"CUDA: built ({f0['cuda']}), a device: {bool(f0['cuda_device'])}, "
                     f"CUDA-aware MPI: {bool(f0['cuda_aware_mpi'])}")
    return lines, list(dict.fromkeys(hints))  # each hint once (nodes of one machine)


def _invalid(value: Any) -> bool:
    """Is ``value`` rank_facts' note of a setting's value pyshard refuses?"""
    return isinstance(value, str) and value.startswith("invalid: ")


def _shm_state(facts: List[Dict[str, Any]], rs: List[int], shared: bool) -> str:
    """What node-shared memory does for the node of ranks ``rs``, and why not where not."""
    def on(name: str, test: Callable[[Any], bool]) -> List[int]:
        return [r for r in rs if test(facts[r]["settings"].get(name))]

    for name in ("PYSHARD_SHM", "PYSHARD_TRANSPORT"):  # (the doctor's mesh took the default)
        refused = on(name, _invalid)
        if refused:
            return (f"{name} has a value pyshard refuses on ranks {_ranks(refused)}: their "
                    "first exchange raises")
    off = on("PYSHARD_SHM", lambda v: v == "off")  # (the transport is set up all the same)
    if off:
        return f"off on ranks {_ranks(off)} (PYSHARD_SHM, PYSHARD_TRANSPORT): exchanges by MPI"
    if shared:
        return "usable"
    if not all(facts[r]["shm_setup"] for r in rs):
        bad = [r for r in rs if not facts[r]["shm_setup"]]
        return f"not usable (ranks {_ranks(bad)} could not set it up): exchanges by MPI"
    sizes = {repr(facts[r]["settings"].get("PYSHARD_NODE_SIZE")) for r in rs}
    if len(sizes) > 1:
        return ("not used: the ranks see different PYSHARD_NODE_SIZE, so they group the "
                "node differently: exchanges by MPI")
    return "not used: exchanges by MPI"


def _cma_state(facts: List[Dict[str, Any]], rs: List[int], hints: List[str],
               host: str) -> str:
    off = [r for r in rs if facts[r]["settings"].get("PYSHARD_CMA", True) is False]
    if all(facts[r]["cma"] for r in rs):
        if not off:
            return "yes"
        return (f"possible, but ranks {_ranks(off)} turned it off (PYSHARD_CMA=0): their "
                "private results are copied over from node-shared memory")
    scope = facts[rs[0]]["ptrace_scope"]
    if off:
        why = f"PYSHARD_CMA=0 on ranks {_ranks(off)} when the mesh was built"
    elif scope is not None and scope >= 2:
        why = f"Yama's ptrace_scope is {scope}"
        hints.append(f"{host}: Yama's ptrace_scope {scope} lets no rank write into another's "
                     "memory: an administrator can set kernel.yama.ptrace_scope=1 (pyshard "
                     "lifts 1 for its ranks); results in private memory are copied once more "
                     "meanwhile (docs/site/troubleshooting.md)")
    else:
        why = "the kernel refused it (a seccomp profile, or ranks of different users)"
        hints.append(f"{host}: node peers cannot write into each other's memory "
                     "(process_vm_writev refused): out= and pyshard.jax results are copied "
                     "once more (docs/site/troubleshooting.md)")
    return f"no ({why}): results in private memory are copied over from node-shared memory"


def _jax_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax") is not None
