"""The ``checkpoint --formats`` bench: save and load GB/s of one float32 array laid out
``Shard(1)`` (each rank's box cuts across the file's row order), through pyshard in every
format and the way a user would without pyshard, in one run:

- ``pyshard <format>``: :func:`~pyshard.save` / :func:`~pyshard.load` (npy, hdf5, zarr,
  safetensors; load back into ``Shard(1)``);
- ``gather+<tool>``: gather the blocks to rank 0 (``Gatherv``), write the whole array with h5py,
  zarr-python or ``safetensors.numpy.save_file``; load: rank 0 reads it, ``Scatterv``;
- ``zarr-python/rank``, ``tensorstore/rank``: a Zarr v3 array whose chunks are each rank's
  column block (the layout most favourable to them), every rank writing and reading its own
  region;
- ``zarr-python shared shards``: the same regions written into shards that span every
  rank's columns (pyshard's shard grid): the row counts the elements lost;
- ``torch DCP``: ``torch.distributed.checkpoint.save`` / ``load`` of a DTensor ``Shard(1)``
  over gloo;
- ``h5py mpio``: h5py's MPI-IO driver, where h5py is built with MPI (pip's is not).

A method whose package is missing is left out with the reason. Times are the slowest rank's
between barriers (median of ``reps``); every method's load is compared with the saved data.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import collectives
from ..array import ShardedArray
from ..checkpoint import load, save
from ..layout import Layout, Shard
from ..mesh import Mesh
from .checkpoint import bench_dir
from .timing import median_s

ALL = ("npy", "hdf5", "zarr", "safetensors")


def _pattern(rows: int, c0: int, c1: int) -> np.ndarray:
    """Columns ``c0:c1`` of the bench array (rows x cols float32, values below 1009)."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(c0, c1, dtype=np.int64)[None, :]
    return ((r * 7919 + c * 31) % 1009).astype(np.float32)


class _Ctx:
    """One run's array: ``rows x cols`` float32, ``Shard(1)`` balanced over the ranks."""

    def __init__(self, mesh: Mesh, nbytes: int, root: str, reps: int, sync: bool) -> None:
        self.mesh, self.comm, self.root, self.reps, self.sync = mesh, mesh.comm, root, reps, sync
        p = self.comm.Get_size()
        n = max(1, nbytes // 4)
        self.cols = max(p, int(np.sqrt(n)) // p * p)  # about square, columns split evenly
        self.rows = max(1, n // self.cols)
        self.layout = Layout((self.rows, self.cols), np.float32, mesh.shape, [Shard(1)])
        b = self.layout.box(mesh.coords)
        self.c0, self.c1 = b[1].start, b[1].stop
        self.local = _pattern(self.rows, self.c0, self.c1)
        self.x = ShardedArray(self.local, self.layout, mesh)
        self.nbytes = self.rows * self.cols * 4
        ext = self.layout.sizes[1]
        self.counts = [self.rows * e for e in ext]
        self.lost: Optional[int] = None

    def ok(self, got: Optional[np.ndarray]) -> bool:
        mine = (
            got is not None and got.shape == self.local.shape and np.array_equal(got, self.local)
        )
        return bool(collectives.all_true(self.comm, mine))

    def time(
        self, save_fn: Callable[[], Any], load_fn: Callable[[], Any]
    ) -> Tuple[float, float, bool]:
        got: List[Any] = [None]
        save_s = median_s(save_fn, self.comm, self.reps)

        def do_load() -> None:
            got[0] = load_fn()

        load_s = median_s(do_load, self.comm, self.reps)
        return save_s, load_s, self.ok(got[0])

    def gather(self) -> Optional[np.ndarray]:
        """The whole array on rank 0 (None elsewhere): Gatherv of the column blocks."""
        send = np.ascontiguousarray(self.local.T)  # a rank's columns, contiguous
        whole = np.empty((self.cols, self.rows), np.float32) if self.comm.Get_rank() == 0 else None
        self.comm.Gatherv(send, [whole, self.counts] if whole is not None else None, root=0)
        return None if whole is None else np.ascontiguousarray(whole.T)

    def scatter(self, whole: Optional[np.ndarray]) -> np.ndarray:
        """This rank's column block of rank 0's ``whole``: Scatterv."""
        recv = np.empty((self.c1 - self.c0, self.rows), np.float32)
        send = None if whole is None else [np.ascontiguousarray(whole.T), self.counts]
        self.comm.Scatterv(send, recv, root=0)
        return np.ascontiguousarray(recv.T)

    def fsync(self, path: str) -> None:
        if self.sync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# ----------------------------------------------------------------------------- methods


def _pyshard(ctx: _Ctx, fmt: str) -> Tuple[float, float, bool]:
    path = os.path.join(ctx.root, "ps-" + fmt)

    def ld() -> np.ndarray:
        return load(path, ctx.mesh, {"x": [Shard(1)]})["x"].local

    return ctx.time(lambda: save(path, {"x": ctx.x}, format=fmt, sync=ctx.sync), ld)


def _gather(ctx: _Ctx, tool: str) -> Tuple[float, float, bool]:
    rank = ctx.comm.Get_rank()
    path = os.path.join(ctx.root, "gather-" + tool)

    def sv() -> None:
        whole = ctx.gather()
        if rank:
            return
        if tool == "h5py":
            import h5py

            with h5py.File(path, "w") as f:
                f["x"] = whole
        elif tool == "zarr":
            import zarr

            shutil.rmtree(path, ignore_errors=True)
            zarr.save_array(path, whole, zarr_format=3)
        else:
            from safetensors.numpy import save_file

            save_file({"x": whole}, path)
        if tool != "zarr":
            ctx.fsync(path)

    def ld() -> np.ndarray:
        whole = None
        if rank == 0:
            if tool == "h5py":
                import h5py

                with h5py.File(path, "r") as f:
                    whole = f["x"][...]
            elif tool == "zarr":
                import zarr

                whole = zarr.open_array(path, mode="r")[...]
            else:
                from safetensors.numpy import load_file

                whole = load_file(path)["x"]
        return ctx.scatter(whole)

    return ctx.time(sv, ld)


def _zarr_per_rank(ctx: _Ctx) -> Tuple[float, float, bool]:
    import zarr

    path = os.path.join(ctx.root, "zarr-rank")
    chunk = (ctx.rows, max(ctx.layout.sizes[1]))

    def sv() -> None:
        if ctx.comm.Get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
            zarr.create_array(path, shape=(ctx.rows, ctx.cols), dtype="f4", chunks=chunk,
                              compressors=None)
        collectives.barrier(ctx.comm)
        a = zarr.open_array(path, mode="r+")
        a[:, ctx.c0:ctx.c1] = ctx.local

    def ld() -> np.ndarray:
        return np.asarray(zarr.open_array(path, mode="r")[:, ctx.c0:ctx.c1])

    return ctx.time(sv, ld)


def _zarr_shared_shards(ctx: _Ctx) -> Tuple[float, float, bool]:
    """zarr-python, every rank writing its ``Shard(1)`` region into a sharded array whose
    shards span all columns (pyshard's shard grid): concurrent partial writes into the same
    shard files. The row's ``lost`` counts the elements that did not survive."""
    import zarr

    path = os.path.join(ctx.root, "zarr-shared")
    p = ctx.comm.Get_size()
    s0 = max(1, -(-ctx.rows // p))
    inner = (s0, max(ctx.layout.sizes[1]))

    def sv() -> None:
        if ctx.comm.Get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
            zarr.create_array(path, shape=(ctx.rows, ctx.cols), dtype="f4", chunks=inner,
                              shards=(s0, inner[1] * p), compressors=None)
        collectives.barrier(ctx.comm)
        a = zarr.open_array(path, mode="r+")
        a[:, ctx.c0:ctx.c1] = ctx.local

    def ld() -> np.ndarray:
        return np.asarray(zarr.open_array(path, mode="r")[:, ctx.c0:ctx.c1])

    save_s, load_s, ok = ctx.time(sv, ld)
    got = ld()
    ctx.lost = int(sum(collectives.allgather(ctx.comm, int(np.sum(got != ctx.local)))))
    return save_s, load_s, True


def _tensorstore_per_rank(ctx: _Ctx) -> Tuple[float, float, bool]:
    import tensorstore as ts

    path = os.path.join(ctx.root, "ts-rank")
    chunk = [ctx.rows, max(ctx.layout.sizes[1])]
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": [ctx.rows, ctx.cols],
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        },
    }

    def sv() -> None:
        if ctx.comm.Get_rank() == 0:
            ts.open(dict(spec, create=True, delete_existing=True)).result()
        collectives.barrier(ctx.comm)
        t = ts.open(spec).result()
        t[:, ctx.c0:ctx.c1].write(ctx.local).result()

    def ld() -> np.ndarray:
        t = ts.open({"driver": "zarr3", "kvstore": spec["kvstore"]}).result()
        return np.asarray(t[:, ctx.c0:ctx.c1].read().result())

    return ctx.time(sv, ld)


def _dcp(ctx: _Ctx) -> Tuple[float, float, bool]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard

    comm = ctx.comm
    if not dist.is_initialized():
        port = collectives.bcast(comm, _free_port() if comm.Get_rank() == 0 else None)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
    if len(set(ctx.layout.sizes[1])) != 1:
        raise ValueError("torch DCP: the columns must split evenly over the ranks")
    tmesh = init_device_mesh("cpu", (comm.Get_size(),))
    dt = DTensor.from_local(torch.from_numpy(ctx.local), tmesh, [TShard(1)], run_check=False)
    path = os.path.join(ctx.root, "dcp")

    def sv() -> None:
        if comm.Get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
        collectives.barrier(comm)
        dcp.save({"x": dt}, checkpoint_id=path)

    def ld() -> np.ndarray:
        empty = DTensor.from_local(torch.empty_like(torch.from_numpy(ctx.local)), tmesh,
                                   [TShard(1)], run_check=False)
        sd = {"x": empty}
        dcp.load(sd, checkpoint_id=path)
        return sd["x"].to_local().numpy()

    return ctx.time(sv, ld)


def _h5py_mpio(ctx: _Ctx) -> Tuple[float, float, bool]:
    import h5py

    if not h5py.get_config().mpi:
        raise ImportError("h5py is built without MPI (pip's wheel): no mpio driver")
    path = os.path.join(ctx.root, "mpio.h5")

    def sv() -> None:
        with h5py.File(path, "w", driver="mpio", comm=ctx.comm) as f:
            d = f.create_dataset("x", (ctx.rows, ctx.cols), "f4")
            with d.collective:
                d[:, ctx.c0:ctx.c1] = ctx.local

    def ld() -> np.ndarray:
        with h5py.File(path, "r", driver="mpio", comm=ctx.comm) as f:
            return f["x"][:, ctx.c0:ctx.c1]

    return ctx.time(sv, ld)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Run = Callable[[_Ctx], Tuple[float, float, bool]]


def methods(formats: List[str]) -> List[Tuple[str, Run]]:
    """(name, run) of every method measured with ``formats``."""
    out: List[Tuple[str, Run]] = []
    for f in formats:
        out.append((f"pyshard {f}", lambda c, f=f: _pyshard(c, f)))
    tools = {"hdf5": "h5py", "zarr": "zarr", "safetensors": "safetensors"}
    for f in formats:
        if f in tools:
            out.append((f"gather+{tools[f]}", lambda c, t=tools[f]: _gather(c, t)))
    if "zarr" in formats:
        out.append(("zarr-python/rank", _zarr_per_rank))
        out.append(("zarr-python shared shards", _zarr_shared_shards))
        out.append(("tensorstore/rank", _tensorstore_per_rank))
    if "safetensors" in formats:
        out.append(("torch DCP", _dcp))
    if "hdf5" in formats:
        out.append(("h5py mpio", _h5py_mpio))
    return out


def bench_formats(
    mesh: Mesh,
    nbytes: int = 1 << 30,
    formats: Optional[List[str]] = None,
    path: Optional[str] = None,
    reps: int = 1,
    sync: bool = False,
    progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
) -> List[Dict[str, Any]]:
    """One row per method: save and load seconds and GB/s of a ``Shard(1)`` float32 array
    of about ``nbytes`` (about square, the columns a multiple of the rank count); collective
    over ``mesh`` (1-D).
    ``formats``: which of :data:`ALL` (default all). A method that cannot run here (its
    package missing, h5py without MPI) gives a row with ``skipped`` and the reason."""
    formats = list(ALL if formats is None else formats)
    bad = [f for f in formats if f not in ALL]
    if bad:
        raise ValueError(f"bench_formats(formats): unknown {bad}; expected some of {ALL}")
    comm = mesh.comm
    for mod in ("h5py", "zarr", "safetensors.numpy", "tensorstore", "torch"):
        try:  # imported before the clocks start: an import is not a save
            __import__(mod)
        except ImportError:
            pass
    root = bench_dir(comm, path)
    ctx = _Ctx(mesh, nbytes, root, reps, sync)
    rows = []
    try:
        for name, run in methods(formats):
            row: Dict[str, Any] = {
                "case": "checkpoint-formats", "method": name, "ranks": comm.Get_size(),
                "bytes": ctx.nbytes, "sync": sync,
            }
            t0 = time.perf_counter()
            ctx.lost = None
            err = None
            try:
                res = run(ctx)
            except Exception as e:  # a missing package, or a tool that fails here
                err, res = f"{type(e).__name__}: {e}", None
            errs = collectives.allgather(comm, err)
            err = next((e for e in errs if e is not None), None)
            if err is not None or res is None:
                row["skipped"] = err
            else:
                s, ld, ok = res
                row.update(save_s=s, load_s=ld, save_GBps=ctx.nbytes / s / 1e9,
                           load_GBps=ctx.nbytes / ld / 1e9, ok=ok)
                if ctx.lost is not None:
                    row["lost_elements"] = ctx.lost
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            if progress is not None:
                progress(row)
    finally:
        collectives.barrier(comm)
        if comm.Get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
        collectives.barrier(comm)
    return rows


def format_formats(rows: List[Dict[str, Any]]) -> str:
    """The bench table: one line per method, GB/s and the ratio to ``pyshard npy``."""
    ref = next((r for r in rows if r["method"] == "pyshard npy" and "save_s" in r), None)
    head = f"{'method':<26} {'save GB/s':>10} {'load GB/s':>10} {'save/npy':>9} {'load/npy':>9}"
    lines = [head]
    for r in rows:
        if "save_s" not in r:
            lines.append(f"{r['method']:<26} skipped: {r.get('skipped')}")
            continue
        rs = f"{r['save_GBps'] / ref['save_GBps']:.2f}" if ref else "-"
        rl = f"{r['load_GBps'] / ref['load_GBps']:.2f}" if ref else "-"
        ok = "" if r["ok"] else "  WRONG DATA"
        if r.get("lost_elements") is not None:
            ok += f"  {r['lost_elements']} of {r['bytes'] // 4} elements lost"
        lines.append(
            f"{r['method']:<26} {r['save_GBps']:>10.3f} {r['load_GBps']:>10.3f} {rs:>9} {rl:>9}{ok}"
        )
    return "\n".join(lines)
