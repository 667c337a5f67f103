"""Checkpoints: sharded arrays saved as plain ``.npy`` files with MPI-IO, loadable anywhere.

A checkpoint is a directory with one standard ``.npy`` file per array (``numpy.load`` opens
it and gives the global array) and a JSON manifest ``manifest.json`` written last. Data moves
with MPI-IO collective writes and reads through subarray file views, so a checkpoint saved
from one mesh, layout and rank count loads into any other. See ``docs/checkpoints.md``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import shutil
import time
import zlib
from math import prod
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.lib.format as npformat
from mpi4py import MPI

from . import _backend as bk
from . import _validate
from .array import ShardedArray, _zeroed
from .layout import Layout, Partial, Placement, Replicate, Shard
from .mesh import Mesh

__all__ = ["save", "load", "checkpoint_info"]

log = logging.getLogger("pyshard")

FORMAT = "pyshard-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"

PathArg = Union[str, "os.PathLike[str]"]

# ----------------------------------------------------------------------------- helpers


class _Failure(Exception):
    """An error rank 0 found; it is broadcast and raised on every rank."""


def _err(kind: str, msg: str) -> Tuple[str, str]:
    return (kind, msg)


def _raise(err: Optional[Tuple[str, str]]) -> None:
    if err is None:
        return
    kind, msg = err
    exc = {"FileNotFoundError": FileNotFoundError, "TypeError": TypeError}.get(kind, ValueError)
    raise exc(msg)


def _on_root(
    comm: MPI.Comm, step: Callable[[], Any], on_error: Callable[[Exception], Tuple[str, str]]
) -> Any:
    """Rank 0 runs ``step``; every rank returns its result or raises the error rank 0 met.

    Collective over ``comm`` (one bcast) on every rank. A :class:`_Failure` carries its own
    error; any other exception becomes ``on_error(exc)``, so the other ranks never wait.
    """
    res: Any = None
    if comm.Get_rank() == 0:
        try:
            res = ("ok", step())
        except _Failure as f:
            res = ("err", f.args[0])
        except Exception as e:  # never leave the other ranks waiting: report anything
            res = ("err", on_error(e))
    res = comm.bcast(res, root=0)
    if res[0] == "err":
        _raise(res[1])
    return res[1]


def _fault(point: str, rank: int) -> None:
    """Fault injection for tests: ``PYSHARD_FAULT=point:rank[,point:rank...]`` kills a rank."""
    spec = os.environ.get("PYSHARD_FAULT", "")
    for item in spec.split(","):
        name, _, who = item.strip().partition(":")
        if name == point and who.strip().isdigit() and int(who) == rank:
            log.warning("pyshard: PYSHARD_FAULT=%s: rank %d exits now", item.strip(), rank)
            # MPI_Abort ends the whole job at once: with a bare os._exit the launcher had to
            # notice the dead rank, and under a nested mpiexec it sometimes never did (the
            # other ranks then waited in their next collective until the test's timeout)
            MPI.COMM_WORLD.Abort(3)
            os._exit(3)


def _norm_path(path: object, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: path must be a str or os.PathLike, got {type(path).__name__}")
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise TypeError(f"{what}: path must be a non-empty str path, got {path!r}")
    return os.path.normpath(p)


def _file_name(name: str, taken: set) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if base.startswith("."):
        base = "_" + base[1:]
    base = base[:120] or "_"
    cand = base
    i = 1
    while cand.lower() in taken or cand.lower() == "manifest":
        cand = f"{base}-{i}"
        i += 1
    taken.add(cand.lower())
    return cand + ".npy"


def _header(shape: Tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy header numpy.save would write for an array of ``shape`` and ``dtype``."""
    d = {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    bio = io.BytesIO()
    try:
        npformat.write_array_header_1_0(bio, d)
    except ValueError:  # header over 64 KiB: format 2.0
        bio = io.BytesIO()
        npformat.write_array_header_2_0(bio, d)
    return bio.getvalue()


def _read_header(fname: str) -> Tuple[Tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran_order, data offset) of a .npy file; ValueError if unreadable."""
    with open(fname, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except Exception as e:  # numpy raises ValueError or others on garbage
            raise ValueError(f"{fname}: not a readable .npy file ({e})") from e
        return tuple(shape), np.dtype(dtype), bool(fortran), f.tell()


def _placement_str(p: Placement) -> str:
    return str(p)


_PLACEMENT_RE = re.compile(
    r"^\s*(?:S\((-?\d+)\)|Shard\((?:dim=)?(-?\d+)\)|(R)|Replicate\(\)"
    r"|P\((\w+)\)|Partial\((?:op=)?'?(\w+)'?\))\s*$"
)


def _parse_placement(p: object) -> object:
    """Placement objects pass through; strings such as ``"S(0)"``, ``"R"``, ``"P(sum)"`` parse."""
    if not isinstance(p, str):
        return p
    m = _PLACEMENT_RE.match(p)
    if not m:
        raise ValueError(f"cannot parse placement {p!r}: expected S(dim), R or P(op)")
    s0, s1, _r, p0, p1 = m.groups()
    if s0 is not None or s1 is not None:
        return Shard(int(s0 if s0 is not None else s1))
    if p0 is not None or p1 is not None:
        return Partial(p0 if p0 is not None else p1)
    return Replicate()


def _box(layout: Layout, coords: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(starts, extents) of the box at ``coords``."""
    b = layout.box(coords)
    return [s.start for s in b], [s.stop - s.start for s in b]


def _is_writer(layout: Layout, coords: Sequence[int]) -> bool:
    """The one replica that writes a box: coordinate 0 on every mesh dim that does not shard."""
    return all(c == 0 for c, p in zip(coords, layout.placements) if not isinstance(p, Shard))


def _read_hints(layout: Layout) -> MPI.Info:
    """MPI-IO hints for reading into ``layout``.

    Where several ranks read the same box (a Replicate mesh dim, or Partial other than sum,
    of size > 1), ROMIO's collective buffering would read once and ship every copy through
    its aggregators; independent reads under the collective call are several times faster
    (measured in docs/checkpoints.md). Other MPI libraries ignore the hint.
    """
    overlap = any(
        n > 1 and (isinstance(p, Replicate) or (isinstance(p, Partial) and p.op != "sum"))
        for n, p in zip(layout.mesh_shape, layout.placements)
    )
    if not overlap:
        return MPI.INFO_NULL
    info = MPI.Info.Create()
    info.Set("romio_cb_read", "disable")
    return info


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B")) & 0xFFFFFFFF


class _View:
    """An etype of ``itemsize`` bytes and a subarray filetype for one box (freed by close)."""

    def __init__(
        self, itemsize: int, shape: Sequence[int], start: Sequence[int], ext: Sequence[int]
    ) -> None:
        self.etype = MPI.BYTE.Create_contiguous(itemsize).Commit()
        self.count = prod(ext)
        if len(shape) == 0 or self.count == 0:
            # 0-d arrays and empty boxes: a trivial view (subarray types refuse zero subsizes)
            self.filetype = self.etype
            self.own = False
        else:
            self.filetype = self.etype.Create_subarray(
                list(shape), list(ext), list(start), order=MPI.ORDER_C
            ).Commit()
            self.own = True

    def free(self) -> None:
        if self.own:
            self.filetype.Free()
        self.etype.Free()


def _collective_io(
    comm: MPI.Comm,
    fname: str,
    lay: Layout,
    disp: int,
    box: Tuple[List[int], List[int], bool],
    buf: np.ndarray,
    *,
    write: bool,
    hints: MPI.Info = MPI.INFO_NULL,
    size: Optional[int] = None,
    sync: bool = False,
) -> None:
    """Write ``buf`` to, or read it from, this rank's box of a .npy file; collective over
    ``comm``. ``box`` is (starts, extents, active): an inactive rank takes part with an
    empty view. ``disp`` is the data offset; ``size`` sets the file size first (writes)."""
    start, ext, active = box
    if not active:
        start, ext = [0] * lay.ndim, [0] * lay.ndim
    view = _View(lay.dtype.itemsize, lay.shape, start, ext)
    try:
        amode = MPI.MODE_WRONLY if write else MPI.MODE_RDONLY
        fh = MPI.File.Open(comm, fname, amode, hints)
        try:
            if size is not None:
                fh.Set_size(size)
            fh.Set_view(disp, view.etype, view.filetype)
            data = buf.reshape(-1) if active else np.empty(0, lay.dtype)
            spec = [data, view.count if active else 0, view.etype]
            if write:
                fh.Write_all(spec)
                if sync:
                    fh.Sync()
            else:
                fh.Read_all(spec)
        finally:
            fh.Close()
    finally:
        view.free()


# ----------------------------------------------------------------------------- save


def _check_arrays(arrays: object) -> List[Tuple[str, ShardedArray]]:
    if not isinstance(arrays, Mapping):
        raise TypeError(
            f"save(arrays): expected a dict name -> ShardedArray, got {type(arrays).__name__}"
        )
    if not arrays:
        raise ValueError("save(arrays): nothing to save (an empty dict has no communicator)")
    items = []
    for name, x in arrays.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"save(arrays): names must be non-empty strings, got {name!r}")
        if not isinstance(x, ShardedArray):
            raise TypeError(
                f"save(arrays[{name!r}]): expected a pyshard.ShardedArray, got {type(x).__name__}"
            )
        items.append((name, x))
    items.sort(key=lambda t: t[0])
    comm = items[0][1].mesh.comm
    for name, x in items[1:]:
        if MPI.Comm.Compare(comm, x.mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
            raise ValueError(
                f"save(arrays[{name!r}]): its mesh is on another communicator than "
                f"arrays[{items[0][0]!r}]; every array of one checkpoint must share the ranks"
            )
    return items


def _entry(name: str, x: ShardedArray, fname: str) -> Dict[str, Any]:
    lay = x.layout
    return {
        "file": fname,
        "shape": list(lay.shape),
        "dtype": lay.dtype.str,
        "nbytes": prod(lay.shape) * lay.dtype.itemsize,
        "mesh_shape": list(lay.mesh_shape),
        "placements": [_placement_str(p) for p in lay.placements],
        "sizes": {str(d): list(e) for d, e in lay.sizes.items()},
    }


def _prepare(path: str, headers: List[Tuple[str, bytes]]) -> Tuple[str, str, str]:
    """Rank 0: check ``path``, make the temporary directory and write the .npy headers;
    (temporary directory, parent directory, token)."""
    token = secrets.token_hex(6)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _Failure(
            _err("FileNotFoundError", f"save: parent directory {parent!r} of {path!r} not found")
        )
    if os.path.lexists(path):
        ok = os.path.isdir(path) and (
            os.path.isfile(os.path.join(path, MANIFEST)) or not os.listdir(path)
        )
        if not ok:
            raise _Failure(
                _err(
                    "ValueError",
                    f"save: refusing to replace {path!r}: it exists and is not a pyshard "
                    f"checkpoint (no {MANIFEST}) nor an empty directory",
                )
            )
    tmp = f"{path}.tmp-{token}"
    os.mkdir(tmp)
    for fname, hdr in headers:
        with open(os.path.join(tmp, fname), "wb") as f:
            f.write(hdr)
    return tmp, parent, token


def _manifest(
    entries: Dict[str, Dict[str, Any]], gathered: list, size: int, meta_json: str
) -> Dict[str, Any]:
    for name, e in entries.items():
        recs = [b for g in gathered for b in g.get(name, [])]
        recs.sort(key=lambda b: b[0])
        e["checksum"] = {
            "algorithm": "crc32",
            "blocks": [{"start": s, "shape": x, "crc32": c} for s, x, c in recs],
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "ranks": size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "numpy": np.__version__,
        "metadata": json.loads(meta_json),
        "arrays": entries,
    }


def _commit(
    path: str, tmp: str, parent: str, token: str, manifest: dict, sync: bool, rank: int
) -> None:
    """Rank 0: write the manifest last, then swap the new directory in for the old one."""
    mpath = os.path.join(tmp, MANIFEST)
    with open(mpath + ".part", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(mpath + ".part", mpath)
    if sync:
        _fsync_dir(tmp)
    _fault("save-before-rename", rank)
    old = None
    if os.path.lexists(path):
        old = f"{path}.old-{token}"
        os.rename(path, old)
    _fault("save-mid-rename", rank)
    try:
        os.rename(tmp, path)
    except OSError:
        if old is not None:
            os.rename(old, path)  # put the previous checkpoint back
        raise
    if sync:
        _fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _meta_json(metadata: object) -> str:
    """``metadata`` (None: empty) as canonical JSON; TypeError unless a JSON-serialisable dict."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save(metadata): expected a dict, got {type(metadata).__name__}")
    try:
        return json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save(metadata): not JSON-serialisable: {e}") from e


def _check_same(comm: MPI.Comm, path: str, meta_json: str, entries: Dict[str, Any]) -> None:
    """Every rank must describe the same checkpoint: one small allgather agrees on it."""
    digest = zlib.crc32(json.dumps([path, meta_json, entries], sort_keys=True).encode())
    digests = comm.allgather(digest)
    if len(set(digests)) != 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            f"save({path!r}): ranks {bad} pass other names, layouts, path or metadata than "
            f"rank 0; every rank must pass the same"
        )


def _write_array(
    comm: MPI.Comm, x: ShardedArray, fname: str, hdr: bytes, nbytes: int, sync: bool
) -> Optional[Tuple[List[int], List[int], int]]:
    """Write one array's data after its header; collective over ``comm`` (a Partial array is
    reduced first, one collective). This rank's (start, shape, crc32) block if it wrote one."""
    if x.layout.partial_mesh_dims():
        target = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
        x = x.redistribute(target, sizes=x.layout.sizes)
    lay = x.layout
    start, ext = _box(lay, x.mesh.coords)
    writes = _is_writer(lay, x.mesh.coords) and prod(ext) > 0
    box = (start, ext, writes)
    local = bk.to_host(x.local)  # MPI-IO writes host memory: a GPU shard is copied down once
    _collective_io(
        comm, fname, lay, len(hdr), box, local, write=True, size=len(hdr) + nbytes, sync=sync
    )
    return (start, ext, _crc(local)) if writes else None


def _write_data(
    comm: MPI.Comm,
    items: List[Tuple[str, ShardedArray]],
    entries: Dict[str, Dict[str, Any]],
    headers: List[Tuple[str, bytes]],
    tmp: str,
    sync: bool,
) -> Dict[str, List[Tuple[List[int], List[int], int]]]:
    """Write every array into ``tmp`` (collective, in name order); this rank's blocks."""
    blocks: Dict[str, List[Tuple[List[int], List[int], int]]] = {}
    for (name, x), (_, hdr) in zip(items, headers):
        fname = os.path.join(tmp, entries[name]["file"])
        block = _write_array(comm, x, fname, hdr, entries[name]["nbytes"], sync)
        if block is not None:
            blocks[name] = [block]
    return blocks


def _finish(
    comm: MPI.Comm,
    path: str,
    prep: Tuple[str, str, str],
    entries: Dict[str, Dict[str, Any]],
    blocks: Dict[str, list],
    meta_json: str,
    sync: bool,
) -> None:
    """Every rank has closed its files: rank 0 gathers the checksums, writes the manifest and
    renames (a gather and a bcast on every rank); a failure removes the temporary directory."""
    tmp, parent, token = prep
    rank, size = comm.Get_rank(), comm.Get_size()
    gathered = comm.gather(blocks, root=0)

    def commit() -> None:
        try:
            manifest = _manifest(entries, gathered, size, meta_json)
            _commit(path, tmp, parent, token, manifest, sync, rank)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def failed(e: Exception) -> Tuple[str, str]:
        return _err("ValueError", f"save({path!r}): cannot write or rename: {e}")

    _on_root(comm, commit, failed)


def save(
    path: PathArg,
    arrays: Mapping[str, ShardedArray],
    metadata: Optional[Mapping[str, Any]] = None,
    *,
    sync: bool = True,
) -> None:
    """Save sharded arrays as a checkpoint directory at ``path``; collective over their mesh.

    path: the checkpoint directory. It is written as ``path.tmp-<random>`` next to it and
    renamed into place after every rank has finished, replacing an earlier checkpoint at
    ``path`` only then; a save that dies midway leaves the earlier one intact.
    arrays: name -> ShardedArray, all on meshes over the same communicator. Partial arrays
    are reduced first (one collective each); of replicated copies exactly one rank writes.
    metadata: a JSON-serialisable dict kept in the manifest (see :func:`checkpoint_info`).
    sync: fsync the data, the manifest and the directory before the rename (default True).

    Every rank must pass the same names, layouts, path and metadata.
    """
    t0 = time.perf_counter()
    path = _norm_path(path, "save")
    items = _check_arrays(arrays)
    meta_json = _meta_json(metadata)
    comm = items[0][1].mesh.comm
    if _validate.enabled:
        layouts = ", ".join(f"{n}: {x.layout!r}" for n, x in items)
        _validate.agree(comm, "save", {"path": repr(path), "arrays": layouts})
    rank, size = comm.Get_rank(), comm.Get_size()
    taken: set = set()
    entries = {name: _entry(name, x, _file_name(name, taken)) for name, x in items}
    headers = [
        (e["file"], _header(tuple(e["shape"]), np.dtype(e["dtype"]))) for e in entries.values()
    ]
    _check_same(comm, path, meta_json, entries)
    # rank 0 makes the temporary directory and writes the headers; everyone learns the result
    prep = _on_root(
        comm,
        lambda: _prepare(path, headers),
        lambda e: _err("ValueError", f"save({path!r}): cannot prepare {path!r}: {e}"),
    )
    blocks = _write_data(comm, items, entries, headers, prep[0], sync)
    _fault("save-after-data", rank)
    _finish(comm, path, prep, entries, blocks, meta_json, sync)
    if rank == 0:
        log.info(
            "pyshard: saved %d array(s), %d bytes, to %s from %d rank(s) in %.3f s",
            len(entries),
            sum(e["nbytes"] for e in entries.values()),
            path,
            size,
            time.perf_counter() - t0,
        )


# ----------------------------------------------------------------------------- reading


def _read_manifest(path: str, what: str) -> Dict[str, Any]:
    """Parse and check ``path/manifest.json``; FileNotFoundError or ValueError if unusable."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        hint = ""
        parent = os.path.dirname(os.path.abspath(path)) or "."
        base = os.path.basename(path)
        try:
            aside = sorted(n for n in os.listdir(parent) if n.startswith(base + ".old-"))
        except OSError:
            aside = []
        if aside:
            hint = (
                f" ({os.path.join(parent, aside[0])} holds a checkpoint set aside by a save that "
                f"stopped during its final rename; rename it back to {path!r})"
            )
        raise FileNotFoundError(f"{what}: no checkpoint directory at {path!r}{hint}")
    if not os.path.isfile(mpath):
        raise FileNotFoundError(
            f"{what}: {path!r} has no {MANIFEST}: not a pyshard checkpoint, or a save that did "
            f"not finish"
        )
    try:
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: {mpath!r} is not valid JSON ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{what}: {mpath!r} is not a pyshard checkpoint manifest")
    if m.get("version") != VERSION:
        raise ValueError(
            f"{what}: {mpath!r} has format version {m.get('version')!r}; this pyshard reads "
            f"version {VERSION}"
        )
    arrays = m.get("arrays")
    if not isinstance(arrays, dict):
        raise ValueError(f"{what}: {mpath!r} has no 'arrays' table")
    for name, e in arrays.items():
        try:
            shape = tuple(int(s) for s in e["shape"])
            np.dtype(e["dtype"])
            str(e["file"])
            if os.path.basename(e["file"]) != e["file"] or e["file"] in ("", ".", ".."):
                raise ValueError("bad file name")
            int(e["nbytes"])
            e["checksum"]["blocks"]  # noqa: B018
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{what}: {mpath!r}: the entry of array {name!r} is malformed ({err!r})"
            ) from err
        if prod(shape) * np.dtype(e["dtype"]).itemsize != int(e["nbytes"]):
            raise ValueError(f"{what}: {mpath!r}: array {name!r} has an inconsistent byte count")
    return m


def checkpoint_info(path: PathArg) -> Dict[str, Any]:
    """Describe a checkpoint from its manifest alone: no MPI communication, no data read.

    path: the checkpoint directory.

    Returns ``{"path", "version", "ranks", "created", "metadata", "arrays"}`` where
    ``arrays[name]`` has ``shape`` (tuple), ``dtype`` (numpy dtype), ``file``, ``nbytes``
    and the layout it was saved from: ``mesh_shape`` (tuple), ``placements`` (strings such
    as ``"S(0)"``, ``"R"``, ``"P(sum)"``) and ``sizes`` (``{array_dim: extents}``).
    Raises FileNotFoundError or ValueError naming the path when it is not a checkpoint.
    """
    path = _norm_path(path, "checkpoint_info")
    m = _read_manifest(path, "checkpoint_info")
    arrays = {}
    for name, e in m["arrays"].items():
        arrays[name] = {
            "shape": tuple(int(s) for s in e["shape"]),
            "dtype": np.dtype(e["dtype"]),
            "file": e["file"],
            "nbytes": int(e["nbytes"]),
            "mesh_shape": tuple(int(s) for s in e.get("mesh_shape", ())),
            "placements": list(e.get("placements", [])),
            "sizes": {int(d): tuple(int(v) for v in x) for d, x in e.get("sizes", {}).items()},
        }
    return {
        "path": path,
        "version": m["version"],
        "ranks": m.get("ranks"),
        "created": m.get("created"),
        "metadata": m.get("metadata", {}),
        "arrays": arrays,
    }


def _check_files(path: str, m: Dict[str, Any], names: Sequence[str]) -> Dict[str, int]:
    """Rank 0: check each named array's file (present, header, size); its data offsets."""
    offsets = {}
    mpath = os.path.join(path, MANIFEST)
    for name in names:
        e = m["arrays"][name]
        fname = os.path.join(path, e["file"])
        if not os.path.isfile(fname):
            raise FileNotFoundError(f"load: array {name!r}: its file {fname!r} is missing")
        shape, dtype, fortran, offset = _read_header(fname)
        want_shape, want_dtype = tuple(e["shape"]), np.dtype(e["dtype"])
        if shape != want_shape or dtype != want_dtype or fortran:
            raise ValueError(
                f"load: {fname!r} holds a {'Fortran-order ' if fortran else ''}{shape} {dtype} "
                f"array, but {mpath!r} says array {name!r} is {want_shape} {want_dtype}"
            )
        have = os.path.getsize(fname)
        want = offset + int(e["nbytes"])
        if have != want:
            what = "truncated" if have < want else "longer than expected"
            raise ValueError(
                f"load: {fname!r} is {what}: {have} bytes, expected {want} "
                f"({offset} header + {e['nbytes']} data) for array {name!r}"
            )
        blocks = e["checksum"]["blocks"]
        covered = sum(prod(b["shape"]) for b in blocks)
        if covered != prod(want_shape):
            raise ValueError(
                f"load: {mpath!r}: the checksummed blocks of array {name!r} cover {covered} of "
                f"{prod(want_shape)} elements"
            )
        offsets[name] = offset
    return offsets


def _verify(
    path: str,
    m: Dict[str, Any],
    names: Sequence[str],
    offsets: Dict[str, int],
    rank: int,
    size: int,
) -> Optional[str]:
    """Re-read this rank's round-robin share of the saved blocks and check their crc32."""
    k = 0
    for name in names:
        e = m["arrays"][name]
        fname = os.path.join(path, e["file"])
        mm = None
        for b in e["checksum"]["blocks"]:
            mine = k % size == rank
            k += 1
            if not mine:
                continue
            if mm is None:
                mm = np.memmap(
                    fname,
                    dtype=np.dtype(e["dtype"]),
                    mode="r",
                    offset=offsets[name],
                    shape=tuple(e["shape"]),
                )
            box = tuple(slice(s, s + n) for s, n in zip(b["start"], b["shape"]))
            got = _crc(mm[box])
            if got != int(b["crc32"]):
                return (
                    f"load: checksum mismatch in {fname!r} (array {name!r}, block at "
                    f"{b['start']} of shape {b['shape']}: crc32 {got:#010x}, manifest says "
                    f"{int(b['crc32']):#010x}): the file is corrupt"
                )
        del mm
    return None


def _check_load_args(
    mesh: object, placements: object, sizes: object
) -> Tuple[List[str], Dict[str, list], Mapping]:
    """Check load's arguments; (sorted names, parsed placements by name, sizes)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"load(mesh): expected a pyshard.Mesh, got {type(mesh).__name__}")
    if not isinstance(placements, Mapping):
        raise TypeError(
            f"load(placements): expected a dict name -> placements, got {type(placements).__name__}"
        )
    sizes = {} if sizes is None else sizes
    if not isinstance(sizes, Mapping):
        raise TypeError(f"load(sizes): expected a dict name -> sizes, got {type(sizes).__name__}")
    for name in sizes:
        if name not in placements:
            raise ValueError(f"load(sizes): {name!r} is not among the names in placements")
    names = sorted(placements)
    want = {}
    for name in names:
        pl = placements[name]
        if isinstance(pl, (str, Placement)) or not isinstance(pl, (list, tuple)):
            raise TypeError(
                f"load(placements[{name!r}]): expected a list with one placement per mesh "
                f"dim, got {pl!r}"
            )
        want[name] = [_parse_placement(p) for p in pl]
    return names, want, sizes


def _read_entries(path: str, names: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """Rank 0: read the manifest and check the named arrays' files; (entries, data offsets)."""
    m = _read_manifest(path, "load")
    unknown = [n for n in names if n not in m["arrays"]]
    if unknown:
        raise ValueError(
            f"load: {path!r} has no array named {unknown[0]!r}; it holds {sorted(m['arrays'])}"
        )
    offsets = _check_files(path, m, names)
    return {n: m["arrays"][n] for n in names}, offsets


def _read_error(path: str, e: Exception) -> Tuple[str, str]:
    """The error every rank raises when rank 0 cannot read the checkpoint at ``path``."""
    if isinstance(e, (FileNotFoundError, ValueError)):
        return _err(type(e).__name__, str(e))
    return _err("ValueError", f"load: cannot read {path!r}: {e!r}")


def _target_layouts(
    entries: Dict[str, Any], mesh: Mesh, want: Dict[str, list], sizes: Mapping
) -> Dict[str, Layout]:
    """The layouts to load into, from the manifest and the arguments: identical on every rank."""
    return {
        n: Layout(tuple(e["shape"]), np.dtype(e["dtype"]), mesh.shape, want[n], sizes.get(n))
        for n, e in entries.items()
    }


def _verify_all(
    comm: MPI.Comm, path: str, m: Dict[str, Any], names: Sequence[str], offsets: Dict[str, int]
) -> None:
    """Each rank checks its share of the saved blocks; one allgather of the verdicts, and
    every rank raises the first mismatch."""
    try:
        bad = _verify(path, m, names, offsets, comm.Get_rank(), comm.Get_size())
    except Exception as e:  # a verdict from every rank, whatever happened
        bad = f"load: cannot verify {path!r}: {e!r}"
    verdicts = comm.allgather(bad)
    bad = next((v for v in verdicts if v is not None), None)
    if bad is not None:
        raise ValueError(bad)


def _read_array(
    mesh: Mesh, fname: str, offset: int, lay: Layout, device: Optional[str] = None
) -> ShardedArray:
    """Read this rank's shard of ``lay`` from a .npy file; collective over ``mesh``. With
    ``device="cuda"`` the shard is read into host memory, then copied to the GPU."""
    start, ext = _box(lay, mesh.coords)
    local = np.empty(tuple(ext), dtype=lay.dtype)
    zero = _zeroed(lay, mesh.coords)
    box = (start, ext, not zero and local.size > 0)
    hints = _read_hints(lay)
    try:
        _collective_io(mesh.comm, fname, lay, offset, box, local, write=False, hints=hints)
    finally:
        if hints != MPI.INFO_NULL:
            hints.Free()
    if zero:
        local[...] = 0
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)


def load(
    path: PathArg,
    mesh: Mesh,
    placements: Mapping[str, Sequence[Union[Placement, str]]],
    sizes: Optional[Mapping[str, Mapping[int, Sequence[int]]]] = None,
    *,
    verify: bool = True,
    device: Optional[str] = None,
) -> Dict[str, ShardedArray]:
    """Load arrays of a checkpoint into any layout on ``mesh``; collective over ``mesh``.

    path: the checkpoint directory written by :func:`save`.
    mesh: the mesh to load onto (any shape and rank count).
    placements: name -> placements list, one per mesh dim (``Shard``/``Replicate``/
    ``Partial`` objects or strings like ``"S(0)"``); the names to load.
    sizes: name -> ``{array_dim: extents}`` for uneven shards (default balanced).
    verify: re-read every saved block once (spread round robin over the ranks) and check
    its crc32 before loading (default True).
    device: ``None`` or ``"cpu"`` for numpy arrays, ``"cuda"`` for cupy arrays on the current
    GPU (read through host memory).

    Every rank raises the same FileNotFoundError or ValueError, naming the path and the
    problem, for a missing manifest or file, a truncated or mismatched .npy, a checksum
    mismatch or an unknown name.
    """
    t0 = time.perf_counter()
    path = _norm_path(path, "load")
    if _validate.enabled and isinstance(mesh, Mesh):
        items = {"path": repr(path), "placements": repr(placements), "sizes": repr(sizes)}
        items["device"] = repr(device)
        _validate.agree(mesh.comm, "load", items)
    names, want, sizes = _check_load_args(mesh, placements, sizes)
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"load(device): expected None, 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and bk.cupy() is None:
        raise ValueError("load(device='cuda'): cupy does not import here; install cupy")
    comm = mesh.comm
    # rank 0 reads the manifest and checks the files; every rank gets its verdict
    entries, offsets = _on_root(
        comm, lambda: _read_entries(path, names), lambda e: _read_error(path, e)
    )
    layouts = _target_layouts(entries, mesh, want, sizes)
    if verify:
        _verify_all(comm, path, {"arrays": entries}, names, offsets)
    out = {
        n: _read_array(
            mesh, os.path.join(path, entries[n]["file"]), offsets[n], layouts[n], device
        )
        for n in names
    }
    if comm.Get_rank() == 0:
        log.info(
            "pyshard: loaded %d array(s) from %s onto %d rank(s) in %.3f s",
            len(names),
            path,
            comm.Get_size(),
            time.perf_counter() - t0,
        )
    return out
