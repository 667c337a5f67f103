"""``algorithm="tune"``: measure the candidate exchanges of a step once, keep the winner.

Modelled on cuDecomp's autotuner. The first time a step of a given kind and size runs with
``algorithm="tune"``, every candidate exchange runs on scratch buffers of the step's shapes
(one warm-up, then timed trials, each the slowest rank of the step's communicator); the
times are combined over the whole mesh (the maximum), so every rank of the mesh adopts the
same winner, and the winner is remembered on the mesh under a key made from the layouts
only: the MPI library, the size of the step's communicator, the memory kind, whether the
exchange is sparse, the step's bytes per rank bucketed by powers of two, and whether
node-shared memory was among the candidates (a choice made with it turned off is not reused
once it is on, nor the other way round). With
``PYSHARD_TUNE_FILE`` set, rank 0 of the mesh reads earlier choices from that JSON file
(every rank gets them by one broadcast) and adds each new choice to it, so the next job
starts tuned. A file set later (``pyshard.config.set``) is read at the mesh's next tuned
call: its choices replace the mesh's own for the same keys, and gain the others.

Tuning happens at the first build of a step's executor, which every rank of the mesh
reaches in the same call; the choices live on the mesh (not in the bounded executor
cache), so a rebuilt executor finds its choice without communicating.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import time
from math import log2, prod
from typing import Any, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

from . import _backend as bk
from . import collectives, config
from .planner import Step
from .route import ALGORITHMS

log = logging.getLogger("pyshard")

TRIALS = 3  # (the candidates are pyshard.route's: it says which a step may take)


def key(step: Step, dev: bool, shm: bool = False) -> str:
    """The tuning key of ``step``: identical on every rank of the mesh (layouts only);
    ``shm``: node-shared memory is among the candidates (the same on every rank too)."""
    lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    g = prod(step.group_shape)
    per_rank = prod(step.src.shape) * step.src.dtype.itemsize // max(1, g)
    bucket = int(log2(per_rank)) if per_rank > 0 else -1
    sparse = 4 * step.max_peers() <= g
    k = f"{lib}|{g}|{'cuda' if dev else 'host'}|{'sparse' if sparse else 'dense'}|2^{bucket}"
    return k + "|shm" if shm else k


def _load(mesh: Any) -> Dict[str, str]:
    """Earlier choices from PYSHARD_TUNE_FILE: read on rank 0 of the mesh, broadcast."""
    path = config.get("PYSHARD_TUNE_FILE")
    data: Dict[str, str] = {}
    if mesh.rank == 0 and path and os.path.exists(path):
        try:
            with open(path) as f:
                raw = json.load(f)
            data = {str(k): str(v) for k, v in raw.items() if v in ALGORITHMS}
        except (OSError, ValueError, AttributeError) as e:
            log.warning("pyshard: ignoring the tuning file %s: %s", path, e)
    return collectives.bcast(mesh.comm, data)


def update_file(path: str, entries: Dict[str, str]) -> None:
    """Add ``entries`` to the tuning file ``path`` (a JSON object), keeping every entry
    already there that they do not replace: those of other meshes of this job (whose rank 0
    wrote since this mesh read the file), of other jobs, and ``tune_mesh``'s ``"mesh|..."``
    ones. The read, merge and atomic replace run under an exclusive ``flock`` of the file's
    directory, so rank 0s writing at once (disjoint meshes, jobs sharing the file) lose no
    entry; where the file system refuses the lock, without it. OSError or ValueError (an
    unreadable file) for the caller to log."""
    d = os.path.dirname(os.path.abspath(path))
    lock = None
    try:
        lock = os.open(d, os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX)
    except OSError:  # (a file system without flock: merge anyway)
        pass
    try:
        out: Dict[str, Any] = {}
        if os.path.exists(path):
            with open(path) as f:
                out = json.load(f)
            if not isinstance(out, dict):
                raise ValueError("not a JSON object")
        out.update(entries)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".pyshard-tune-")
        with os.fdopen(fd, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    finally:
        if lock is not None:
            os.close(lock)  # (releases the lock)


def _save(mesh: Any, choices: Dict[str, str]) -> None:
    path = config.get("PYSHARD_TUNE_FILE")
    if mesh.rank != 0 or not path:
        return
    try:
        update_file(path, choices)
    except (OSError, ValueError, AttributeError) as e:
        log.warning("pyshard: cannot write the tuning file %s: %s", path, e)


def choose(step: Step, mesh: Any, dev: bool, build: Any, candidates: Tuple[str, ...]) -> str:
    """The tuned algorithm for ``step`` among ``candidates`` (what :func:`pyshard.route.route`
    lists for it: the same on every rank), collective over the mesh the first time a key is
    seen. ``build(algorithm)`` returns an executor for the step."""
    choices = mesh.cache.tuned
    path = config.get("PYSHARD_TUNE_FILE")
    if choices is None or path != mesh.cache.tuned_file:
        # the first tuned call, or the file changed since (config.set): read it; its
        # choices win over this mesh's earlier ones, which it gains where it has none
        loaded = _load(mesh)
        extra = {k: v for k, v in (choices or {}).items() if k not in loaded}
        if extra:
            _save(mesh, extra)
        choices = mesh.cache.tuned = {**extra, **loaded}
        mesh.cache.tuned_file = path
    k = key(step, dev, "shm" in candidates)
    if k in choices:
        return choices[k]
    cands = candidates
    times = np.asarray(_measure(step, mesh, dev, [build(c) for c in cands]))
    worst = collectives.max_all_array(mesh.comm, times)  # the same on every rank
    best = cands[int(np.argmin(worst))]
    choices[k] = best
    _save(mesh, choices)
    if mesh.rank == 0:
        log.info(
            "pyshard: tuned %s: %s (%s ms)",
            k,
            best,
            ", ".join(f"{c} {1e3 * t:.3f}" for c, t in zip(cands, worst)),
        )
    return best


def _measure(step: Step, mesh: Any, dev: bool, execs: List[Any]) -> List[float]:
    """Median seconds of each executor on scratch buffers (slowest rank of the step)."""
    xp = bk.cupy() if dev else np
    coords = mesh.coords
    src = xp.zeros(step.src.local_shape(coords), step.src.dtype)
    dst = xp.empty(step.dst.local_shape(coords), step.dst.dtype)
    group = mesh.sub_dims(step.mesh_dims)
    out = []
    for e in execs:
        into = None if getattr(e, "node", None) is not None else dst  # shm: a plain call's result
        e.run(src, into)  # warm-up
        ts = []
        for _ in range(TRIALS):
            collectives.barrier(group)
            t0 = time.perf_counter()
            e.run(src, into)
            if dev:
                xp.cuda.get_current_stream().synchronize()
            ts.append(collectives.max_all(group, time.perf_counter() - t0))
        out.append(float(np.median(ts)))
    return out
