"""Checkpoints in HDF5, Zarr v3 and safetensors: round trips from random layouts, files from
the tools themselves loaded into random layouts, pyshard's files opened by the tools, the
concurrent-write check, untrusted files and killed saves.

safetensors needs no package to write or read, so its round trips, bad files and killed saves
run everywhere (the MPI matrix included: they go through each library's MPI-IO). HDF5 and
Zarr need h5py and zarr-python (requirements/dev.txt); the tests that open files with the
tools (h5py, zarr-python, tensorstore, safetensors, torch) are marked ``numerics``: what they
check does not depend on the MPI library.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import struct
import tempfile

import numpy as np
import pytest
from ckpt_worker import check_loaded, global_of, make_sharded
from oracle import ML_DTYPES, agree, make_global
from test_checkpoint import mpirun, needs_subprocess, on_rank0, same_error, save_limited, spec
from test_redistribute_nd import counts_since

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.checkpoint import (
    formats,
    hdf5_format,
    reader,
    reading,
    saving,
    zarr_meta,
    zarr_read,
)
from pyshard.checkpoint.driver import Format
from pyshard.checkpoint.zarr_format import ZarrFormat

pytestmark = pytest.mark.mpi

FORMATS = ["safetensors", "hdf5", "zarr"]
EXT = {"safetensors": ".safetensors", "hdf5": ".h5", "zarr": ".zarr"}


@pytest.fixture
def shared_dir(comm):
    """A directory made by rank 0 and shared by every rank."""
    d = tempfile.mkdtemp(prefix="pyshard-fmt-") if comm.rank == 0 else None
    d = comm.bcast(d, root=0)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def need(fmt):
    """Skip unless the format's package imports here (the MPI matrix's venvs lack them)."""
    if fmt == "hdf5":
        pytest.importorskip("h5py", reason="HDF5 checkpoints need h5py (pyshard[hdf5])")
    elif fmt == "zarr":
        pytest.importorskip("zarr", reason="Zarr checkpoints need zarr-python 3 (pyshard[zarr])")


def available(fmts):
    """Those of ``fmts`` whose package imports here (:func:`need`), the others left out."""
    out = []
    for fmt in fmts:
        try:
            need(fmt)
            out.append(fmt)
        except pytest.skip.Exception:
            pass
    return out


def rand_sizes(rng, n, parts):
    """Random extents of ``n`` over ``parts`` shards (empty ones included)."""
    cuts = np.sort(rng.integers(0, n + 1, parts - 1))
    return [int(v) for v in np.diff(np.concatenate([[0], cuts, [n]]))]


def random_specs(comm, seed):
    """A few small arrays in random 1-D layouts (uneven and empty shards, Partial sources,
    bfloat16 and float8), the same on every rank."""
    rng = np.random.default_rng(seed)
    p = comm.size
    dts = ["float32", "int64", "bool", "float16", "complex64", *ML_DTYPES]
    out = {}
    for i, dt in enumerate(dts):
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 6)))
        kind = ["S0", "S1", "R", "P"][i % 4]
        if kind == "P" and dt == "bool":
            kind = "S0"
        if kind == "S0":
            out[f"a{i}-{dt}"] = spec(shape, dt, i, ["S(0)"], {0: rand_sizes(rng, shape[0], p)})
        elif kind == "S1":
            out[f"a{i}-{dt}"] = spec(shape, dt, i, ["S(1)"], {1: rand_sizes(rng, shape[1], p)})
        else:
            out[f"a{i}-{dt}"] = spec(shape, dt, i, ["R"] if kind == "R" else ["P(sum)"])
    out["empty"] = spec((0, 3), "float32", 0, ["S(0)"])
    out["scalar"] = spec((), "float64", 5, ["R"])
    out["nested/v"] = spec((5,), "int32", 6, ["S(0)"])
    return out


def targets_of(specs, comm, seed):
    """Other random layouts of the same arrays on a 2-D mesh (or 1-D at prime sizes)."""
    rng = np.random.default_rng(seed)
    p = comm.size
    a = next((d for d in (2, 3) if p % d == 0 and p > d), 1)
    mesh = ps.Mesh(comm, (a, p // a))
    placements, sizes = {}, {}
    for n, s in specs.items():
        nd = len(s["shape"])
        if nd == 0:
            placements[n] = [Replicate(), Replicate()]
            continue
        choice = int(rng.integers(0, 4))
        if choice == 0:
            placements[n] = [Shard(nd - 1), Replicate()]
        elif choice == 1 and nd == 2:
            placements[n] = [Shard(1), Shard(0)]
        elif choice == 2:
            placements[n] = [Replicate(), Shard(0)]
            sizes[n] = {0: rand_sizes(rng, s["shape"][0], p // a)}
        else:
            placements[n] = [ps.Partial("sum") if s["dtype"] != "bool" else Replicate(), Shard(0)]
    return mesh, placements, sizes


def check_all(out, specs, where):
    bad = [check_loaded(n, out[n], global_of(s), where) for n, s in specs.items()]
    return [b for b in bad if b]


@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip(comm, shared_dir, fmt):
    """Saved from random layouts, loaded into others on another mesh, bit for bit."""
    need(fmt)
    mesh = ps.Mesh(comm, (comm.size,))
    specs = random_specs(comm, 11)
    path = os.path.join(shared_dir, "ck" + EXT[fmt])
    arrays = {n: make_sharded(mesh, s) for n, s in specs.items()}
    ps.save(path, arrays, {"step": 3, "run": "x"}, format=fmt)
    info = ps.checkpoint_info(path)
    assert info["format"] == fmt and info["metadata"] == {"step": 3, "run": "x"}
    assert info["ranks"] == comm.size and sorted(info["arrays"]) == sorted(specs)
    for n, s in specs.items():
        e = info["arrays"][n]
        assert e["shape"] == tuple(s["shape"]) and str(e["dtype"]) == s["dtype"], (n, e)
        assert e["placements"] == s["placements"]
    mesh2, placements, sizes = targets_of(specs, comm, 12)
    out = ps.load(path, mesh2, placements, sizes)
    assert check_all(out, specs, f"{fmt}: ") == []
    # saving again replaces the file atomically
    ps.save(path, {"only": arrays["scalar"]}, format=fmt)
    assert sorted(ps.checkpoint_info(path)["arrays"]) == ["only"]
    assert glob.glob(path + ".tmp-*") == []


@pytest.mark.parametrize("fmt", ["npy", "safetensors", "hdf5"])
def test_direct_reads_equal_the_exchanges(comm, shared_dir, monkeypatch, fmt):
    """Arrays stored whole in one file load into random layouts on a 2-D mesh the same, bit
    for bit, whether every rank copies its box straight out of the file
    (PYSHARD_LOAD_DIRECT_BYTES=0: no exchange runs) or reads row blocks and redistributes
    (.npy: one collective read), uneven and empty shards, bfloat16 and float8 included."""
    need(fmt)
    monkeypatch.setenv("PYSHARD_LOAD_FUSE", "0")  # the small arrays go the same ways
    mesh = ps.Mesh(comm, (comm.size,))
    specs = random_specs(comm, 21)
    path = os.path.join(shared_dir, "direct" + EXT.get(fmt, ""))
    ps.save(path, {n: make_sharded(mesh, s) for n, s in specs.items()}, format=fmt)
    mesh2, placements, sizes = targets_of(specs, comm, 22)
    boxes = []  # the arrays this rank copied straight out of the file
    real = reading.read_box

    def read_box(fname, offset, lay, coords):
        boxes.append(fname)
        return real(fname, offset, lay, coords)

    monkeypatch.setattr(reading, "read_box", read_box)
    for limit in (0, 1 << 62):
        boxes.clear()
        with ps.config.override(PYSHARD_LOAD_DIRECT_BYTES=limit):
            before = ps.comm_stats()
            out = ps.load(path, mesh2, placements, sizes)
            got = counts_since(before)
        assert check_all(out, specs, f"{fmt}, direct from {limit} B: ") == []
        if limit:
            assert boxes == []
            continue
        assert len(boxes) >= 3, boxes
        if fmt != "hdf5":  # (h5py stores some small datasets chunked: read in blocks)
            assert got == {}, got


def test_direct_read_falls_back_where_a_rank_cannot_map(comm, shared_dir, monkeypatch):
    """Where one rank's file system cannot map the file (mmap raises ENODEV there), every rank
    reads the array the other way (row blocks and a redistribute) and gets its box right; a
    rank that cannot read the file at all makes every rank raise the same ValueError."""
    mesh = ps.Mesh(comm, (comm.size,))
    s = spec((6, 4 * comm.size + 1), "float64", 3, ["S(0)"])
    path = os.path.join(shared_dir, "nomap.safetensors")
    ps.save(path, {"a": make_sharded(mesh, s)}, format="safetensors")
    monkeypatch.setenv("PYSHARD_LOAD_FUSE", "0")  # (a small array: else read fused)
    real = reading.mmap.mmap
    last = comm.size - 1
    tried = []

    def refuse(*args, **kwargs):
        tried.append(1)
        if comm.rank == last:
            raise OSError(19, "No such device")
        return real(*args, **kwargs)

    monkeypatch.setattr(reading.mmap, "mmap", refuse)
    with ps.config.override(PYSHARD_LOAD_DIRECT_BYTES=0):
        before = ps.comm_stats()
        out = ps.load(path, mesh, {"a": [Shard(1)]})
        got = counts_since(before)
        assert check_all(out, {"a": s}, "fallback: ") == []
        assert tried, "the direct read was not tried"
        if comm.size > 1:
            assert got, "the fallback's redistribute did not run"
        monkeypatch.setattr(reading.mmap, "mmap", real)
        real_open = open

        def no_file(name, *args, **kwargs):
            if comm.rank == last and str(name).endswith("nomap.safetensors"):
                raise PermissionError(13, "Permission denied", name)
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr("builtins.open", no_file)
        # (on one rank, rank 0's check of the file meets the error first)
        match = "cannot read .*Permission denied" if comm.size > 1 else "nomap.safetensors"
        with pytest.raises(ValueError, match=match):
            ps.load(path, mesh, {"a": [Shard(1)]})


def test_direct_read_rule():
    """The shortest run of any box, from the layout alone: the last dim split into two or
    more non-empty shards ends the runs; empty shards do not count."""
    f4 = "float32"
    lay = ps.Layout((16, 4096), f4, (4,), [Shard(1)])
    assert reader.shortest_run(lay) == 1024 * 4
    lay = ps.Layout((16, 4096), f4, (4,), [Shard(0)])
    assert reader.shortest_run(lay) == 4 * 4096 * 4
    lay = ps.Layout((16, 10, 3), f4, (2, 2), [Shard(0), Shard(1)], {1: [7, 3]})
    assert reader.shortest_run(lay) == 3 * 3 * 4
    lay = ps.Layout((16, 10, 3), f4, (4,), [Shard(1)], {1: [0, 7, 0, 3]})
    assert reader.shortest_run(lay) == 3 * 3 * 4
    lay = ps.Layout((16, 10), f4, (4,), [Shard(1)], {1: [0, 10, 0, 0]})  # one holds all
    assert reader.shortest_run(lay) == 16 * 10 * 4
    lay = ps.Layout((16, 10), f4, (4,), [Replicate()])
    assert reader.shortest_run(lay) == 16 * 10 * 4
    with ps.config.override(PYSHARD_LOAD_DIRECT_BYTES=4096):
        assert reader.loads_direct(ps.Layout((16, 4096), f4, (4,), [Shard(1)]))
        assert not reader.loads_direct(ps.Layout((16, 4096), f4, (8,), [Shard(1)]))
        assert not reader.loads_direct(ps.Layout((16, 4096), f4, (4,), [ps.Partial("sum")]))


def test_safetensors_layout(comm, shared_dir):
    """The file is what the format says: length, JSON header, tensors back to back."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_of(spec((6, 4), "float32", 1, ["S(1)"]))
    path = os.path.join(shared_dir, "m.safetensors")
    ps.save(path, {"w": ps.distribute(g, mesh, [Shard(1)])}, {"format": "pt"}, format="safetensors")

    def check():
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            hdr = json.loads(f.read(n))
            data = f.read()
        assert (8 + n) % 8 == 0
        assert hdr["w"] == {"dtype": "F32", "shape": [6, 4], "data_offsets": [0, 96]}
        assert hdr["__metadata__"]["format"] == "pt"  # the user's string metadata, flat
        assert np.array_equal(np.frombuffer(data, "<f4").reshape(6, 4), g)

    on_rank0(comm, check)


@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_an_array_resized_by_another_tool(comm, shared_dir, fmt, caplog):
    """A pyshard checkpoint whose array another tool resized since the save (zarr-python's
    resize; safetensors rewritten with the same metadata and a longer tensor) describes and
    loads it as the file has it now: the saved layout, whose shard table no longer fits the
    shape, is dropped with a warning (before, checkpoint_info gave shape 12 with saved
    sizes summing to 10, which load(..., sizes=) then refused)."""
    need(fmt)
    if fmt == "safetensors":  # (the tool that rewrites the file; the matrix's venvs lack it)
        pytest.importorskip("safetensors", reason="rewriting the file needs safetensors")
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(40.0).reshape(10, 4)
    sizes = [10] + [0] * (comm.size - 1)
    x = ps.distribute(g, mesh, [Shard(0)], sizes={0: sizes})
    path = os.path.join(shared_dir, "r." + fmt)
    ps.save(path, {"x": x}, {"v": 1}, format=fmt)
    grown = np.concatenate([g, np.full((2, 4), 99.0)])
    if comm.rank == 0:
        if fmt == "zarr":
            import zarr

            a = zarr.open_array(os.path.join(path, "x"), mode="r+")
            a.resize((12, 4))
            a[10:] = 99.0
        else:
            from safetensors import safe_open
            from safetensors.numpy import save_file

            with safe_open(path, "np") as f:
                meta = f.metadata()
            save_file({"x": grown}, path, metadata=meta)
    comm.Barrier()
    failures = []
    with caplog.at_level("WARNING", logger="pyshard"):
        info = ps.checkpoint_info(path)["arrays"]["x"]
        y = ps.load(path, mesh, {"x": [Shard(0)]})["x"]
    warned = any("resized by another tool" in r.getMessage() for r in caplog.records)
    if not any(comm.allgather(warned)):
        failures.append("no rank warned of the resized array")
    if info["shape"] != (12, 4) or info["sizes"] or info["placements"]:
        failures.append(f"checkpoint_info: {info}")
    if y.shape != (12, 4) or not np.array_equal(y.local, grown[y.box]):
        failures.append(f"loaded {y.shape}: {y.local}")
    agree(comm, failures)


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_an_array_recast_by_another_tool(comm, shared_dir, fmt, caplog):
    """h5py or zarr-python replaces a pyshard array with one of another dtype (same shape),
    and widens a replicated one along a dim its shard table does not cover: both are
    described and loaded as the file has them now, with no saved layout and a warning
    (only safetensors' recasts were noticed before: checkpoint_info kept the old layout)."""
    need(fmt)
    tool = pytest.importorskip("h5py" if fmt == "hdf5" else "zarr")
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(40, dtype=np.int32).reshape(10, 4)
    path = os.path.join(shared_dir, "c." + fmt)
    ps.save(path, {"v": ps.distribute(g, mesh, [Shard(0)]),
                   "r": ps.distribute(g, mesh, [Replicate()])}, format=fmt)
    v_now = (g * 0.5).astype(np.float32)
    r_now = np.concatenate([g, g + 100], axis=1)  # 10 x 8
    if comm.rank == 0:
        if fmt == "hdf5":
            with tool.File(path, "r+") as f:
                for name, a in (("v", v_now), ("r", r_now)):
                    del f[name]
                    f.create_dataset(name, data=a)
        else:
            for name, a in (("v", v_now), ("r", r_now)):
                z = tool.open_array(os.path.join(path, name), mode="r")
                attrs = dict(z.attrs)
                tool.create_array(os.path.join(path, name), shape=a.shape, dtype=a.dtype,
                                  chunks=a.shape, overwrite=True, attributes=attrs)[...] = a
    comm.Barrier()
    failures = []
    with caplog.at_level("WARNING", logger="pyshard"):
        info = ps.checkpoint_info(path)["arrays"]
        out = ps.load(path, mesh, {"v": [Shard(0)], "r": [Shard(1)]})
    said = " | ".join(r.getMessage() for r in caplog.records)
    if "recast by another tool" not in said or "resized by another tool" not in said:
        failures.append(f"warnings: {said!r}")
    for name, now in (("v", v_now), ("r", r_now)):
        i = info[name]
        if i["shape"] != now.shape or i["dtype"] != now.dtype or i["placements"]:
            failures.append(f"checkpoint_info[{name!r}]: {i}")
        y = out[name]
        if y.dtype != now.dtype or not np.array_equal(y.local, now[y.box]):
            failures.append(f"{name}: loaded {y.dtype} {y.local}")
    agree(comm, failures)


# ----------------------------------------------------------------------------- the tools


def _tool_files(d):
    """Rank 0: files written by the tools themselves; {path: {name: global array}}."""
    made = {}
    rng = np.random.default_rng(5)
    a = rng.standard_normal((13, 7)).astype(np.float32)
    b = (rng.integers(-1000, 1000, (9, 5, 3))).astype(np.int64)
    c = rng.standard_normal((11,)).astype(np.float64)
    from safetensors.numpy import save_file

    f = os.path.join(d, "np.safetensors")
    save_file({"a": a, "b": b, "c": c}, f)
    made[f] = {"a": a, "b": b, "c": c}
    try:
        import torch
        from safetensors.torch import save_file as tsave

        f = os.path.join(d, "torch.safetensors")
        t16 = torch.arange(30, dtype=torch.float32).reshape(5, 6).to(torch.bfloat16)
        tsave({"w": torch.from_numpy(a), "h": t16}, f)
        import ml_dtypes

        h = (np.arange(30, dtype=np.float32).reshape(5, 6)).astype(ml_dtypes.bfloat16)
        made[f] = {"w": a, "h": h}
    except ImportError:
        pass
    try:
        import h5py

        f = os.path.join(d, "tool.h5")
        with h5py.File(f, "w") as h5:
            h5["contig"] = a
            h5.create_dataset("grp/chunked", data=b, chunks=(2, 3, 2), compression="gzip")
            h5.create_dataset("big_endian", data=c.astype(">f8"))
            h5.create_dataset("unwritten", shape=(4, 3), dtype="i4", fillvalue=7)
            h5.create_dataset("scalar", data=np.float64(2.5))
        made[f] = {
            "contig": a,
            "grp/chunked": b,
            "big_endian": c,
            "unwritten": np.full((4, 3), 7, np.int32),
            "scalar": np.array(2.5),
        }
    except ImportError:
        pass
    try:
        import zarr
        from zarr.codecs import ZstdCodec

        f = os.path.join(d, "tool.zarr")
        g = zarr.open_group(f, mode="w")
        x = g.create_array("x", shape=b.shape, dtype=b.dtype, chunks=(2, 2, 3), shards=(4, 4, 3),
                           compressors=ZstdCodec(level=3))
        x[...] = b
        y = g.create_array("y", shape=a.shape, dtype=a.dtype, chunks=(5, 3))
        y[...] = a
        made[f] = {"x": b, "y": a}
        f = os.path.join(d, "lone.zarr")
        z = zarr.create_array(f, shape=c.shape, dtype=c.dtype, chunks=(4,), shards=(8,))
        z[...] = c
        made[f] = {"lone": c}
    except ImportError:
        pass
    try:
        import tensorstore as ts

        f = os.path.join(d, "ts.zarr")
        spec_ = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": f},
            "metadata": {
                "shape": list(b.shape),
                "data_type": "int64",
                "codecs": [{"name": "sharding_indexed", "configuration": {
                    "chunk_shape": [3, 2, 3],
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                               {"name": "zstd"}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                     {"name": "crc32c"}]}}],
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [6, 4, 3]}},
            },
            "create": True,
            "delete_existing": True,
        }
        t = ts.open(spec_).result()
        t[...] = b
        made[f] = {"ts": b}
    except ImportError:
        pass
    return made


@pytest.mark.numerics
def test_tool_files_load(comm, shared_dir):
    """Files from safetensors (numpy, torch), h5py (contiguous, chunked and compressed,
    big-endian, unwritten, 0-d), zarr-python (odd chunk and shard shapes, compressed, a lone
    array) and tensorstore, loaded into random layouts."""
    pytest.importorskip("safetensors")
    made = on_rank0(comm, lambda: _tool_files(shared_dir))
    rng = np.random.default_rng(7)
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    failures = []
    for f, arrays in made.items():
        placements, sizes = {}, {}
        for n, g in arrays.items():
            if g.ndim == 0:
                placements[n] = [Replicate()]
                continue
            d = int(rng.integers(0, g.ndim))
            placements[n] = [Shard(d)]
            sizes[n] = {d: rand_sizes(rng, g.shape[d], p)}
        out = ps.load(f, mesh, placements, sizes)
        for n, g in arrays.items():
            y = out[n]
            got = np.asarray(y.local).reshape(y.layout.local_shape(mesh.coords))
            if y.dtype != g.dtype or not np.array_equal(got, g[y.layout.box(mesh.coords)]):
                failures.append(f"{f}: {n}: rank {comm.rank} holds wrong data ({y.dtype})")
    assert failures == []


@pytest.mark.numerics
def test_tools_open_ours(comm, shared_dir):
    """What pyshard writes opens in h5py, safetensors (numpy, torch), zarr-python and
    tensorstore, and equals the global arrays (bfloat16 and float8 too where the tool has
    them)."""
    pytest.importorskip("safetensors")
    mesh = ps.Mesh(comm, (comm.size,))
    specs = random_specs(comm, 21)
    arrays = {n: make_sharded(mesh, s) for n, s in specs.items()}
    paths = {}
    for fmt in available(FORMATS):
        paths[fmt] = os.path.join(shared_dir, "ours" + EXT[fmt])
        ps.save(paths[fmt], arrays, format=fmt)
    # safetensors.numpy has no float8 (numpy has none): a file without it for that one
    no_f8 = {n: x for n, x in arrays.items() if "float8" not in n}
    paths["np"] = os.path.join(shared_dir, "ours-np.safetensors")
    ps.save(paths["np"], no_f8, format="safetensors")

    def check():
        bad = []
        glob_ = {n: global_of(s) for n, s in specs.items()}

        def cmp(tool, n, got):
            want = glob_[n]
            got = np.asarray(got)
            if got.dtype != want.dtype and got.dtype.kind == "u" and want.dtype.kind == "V":
                got = got.view(want.dtype)  # h5py and zarr-python see ml_dtypes as raw bits
            if got.shape != want.shape or not np.array_equal(got, want):
                bad.append(f"{tool}: {n}: {got.dtype}{got.shape} differs")

        from safetensors.numpy import load_file

        loaded = load_file(paths["np"])
        assert sorted(loaded) == sorted(n for n in specs if "float8" not in n)
        for n, a in loaded.items():
            cmp("safetensors.numpy", n, a)
        try:
            from safetensors.torch import load_file as tload

            loaded = tload(paths["safetensors"])
            assert sorted(loaded) == sorted(specs)
            for n, t in loaded.items():
                if str(t.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn"):
                    t = t.view(torch_uint(t))
                cmp("safetensors.torch", n, t.numpy())
        except ImportError:
            pass
        if "hdf5" in paths:
            import h5py

            with h5py.File(paths["hdf5"], "r") as f:
                for n in specs:
                    cmp("h5py", n, f[n][()])
                    if n.startswith("a0"):
                        assert f[n].id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
        if "zarr" in paths:
            import zarr

            g = zarr.open_group(paths["zarr"], mode="r")
            for n in specs:
                if specs[n]["dtype"] in ML_DTYPES:
                    continue  # zarr-python 3.1 has no bfloat16 / float8 data type
                cmp("zarr-python", n, g[n][...])
            try:
                import tensorstore as ts

                for n in specs:
                    t = ts.open(
                        {"driver": "zarr3", "kvstore": {"driver": "file",
                                                        "path": os.path.join(paths["zarr"], n)}}
                    ).result()
                    cmp("tensorstore", n, t.read().result())
            except ImportError:
                pass
        return bad

    assert on_rank0(comm, check) == []


def torch_uint(t):
    import torch

    return torch.uint16 if t.element_size() == 2 else torch.uint8


def test_zarr_compressed(comm, shared_dir):
    """compression='zstd': zarr-python reads the shards, and so does pyshard."""
    need("zarr")
    mesh = ps.Mesh(comm, (comm.size,))
    s = spec((3 * comm.size + 2, 3), "float64", 4, ["S(1)"])
    g = global_of(s)
    path = os.path.join(shared_dir, "zstd.zarr")
    ps.save(path, {"x": make_sharded(mesh, s)}, format="zarr", compression="zstd")

    def check():
        import zarr

        a = zarr.open_group(path, mode="r")["x"]
        assert any(c.get("name") == "zstd" for c in
                   a.metadata.to_dict()["codecs"][0]["configuration"]["codecs"])
        return bool(np.array_equal(a[...], g))

    assert on_rank0(comm, check)
    out = ps.load(path, mesh, {"x": [Replicate()]})
    np.testing.assert_array_equal(out["x"].local, g)
    with pytest.raises(ValueError, match="compression"):
        ps.save(path, {"x": make_sharded(mesh, s)}, format="hdf5", compression="zstd")


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_zarr_shards_read_directly(comm, shared_dir, monkeypatch, compression):
    """Shards are read straight from their files through zarr-python's codec classes (plain
    chunks read into place, zstd ones decoded by ZstdCodec): the same shards as through a
    zarr-python Array, in any layout; a shard index that fails its crc32c raises on every
    rank."""
    need("zarr")
    mesh = ps.Mesh(comm, (comm.size,))
    s = spec(
        (2 * comm.size + 3, 5, 2),
        "int32",
        8,
        ["S(0)"],
        {0: [2 * comm.size + 3] + [0] * (comm.size - 1)},
    )
    g = global_of(s)
    path = os.path.join(shared_dir, "direct.zarr")
    ps.save(path, {"x": make_sharded(mesh, s)}, format="zarr", compression=compression)
    calls = []
    real = zarr_read.read_direct
    monkeypatch.setattr(zarr_read, "read_direct", lambda *a: calls.append(1) or real(*a))
    for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
        out = ps.load(path, mesh, {"x": pl})
        np.testing.assert_array_equal(out["x"].local, g[out["x"].box])
    assert comm.allreduce(len(calls)) > 0, "the direct shard reader was not used"
    monkeypatch.setenv("PYSHARD_ZARR_DIRECT", "0")
    out = ps.load(path, mesh, {"x": [Shard(2)]})
    np.testing.assert_array_equal(out["x"].local, g[out["x"].box])
    monkeypatch.setenv("PYSHARD_ZARR_DIRECT", "1")
    # zstd chunks through zarr-python's own pipeline (ZstdCodec) instead of numcodecs' Zstd:
    # the same files, byte for byte, and the same loads (decoded a few chunks per call)
    monkeypatch.setenv("PYSHARD_ZARR_NUMCODECS_ZSTD", "0")
    monkeypatch.setenv("PYSHARD_ZARR_DECODE_BYTES", "100")
    out = ps.load(path, mesh, {"x": [Shard(1)]})
    np.testing.assert_array_equal(out["x"].local, g[out["x"].box])
    path2 = os.path.join(shared_dir, "pipeline.zarr")
    ps.save(path2, {"x": make_sharded(mesh, s)}, format="zarr", compression=compression)
    monkeypatch.setenv("PYSHARD_ZARR_NUMCODECS_ZSTD", "1")

    def same_files():
        names = sorted(glob.glob(os.path.join(path, "x", "c", "**", "*"), recursive=True))
        names = [f for f in names if os.path.isfile(f)]
        for f in names:
            with open(f, "rb") as a, open(f.replace(path, path2, 1), "rb") as b:
                assert a.read() == b.read(), f
        return len(names)

    assert on_rank0(comm, same_files) > 0

    def corrupt():
        f = sorted(glob.glob(os.path.join(path, "x", "c", "*", "*", "*")))[0]
        with open(f, "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            c = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([c[0] ^ 1]))

    on_rank0(comm, corrupt)
    with pytest.raises(ValueError, match="crc32c"):
        ps.load(path, mesh, {"x": [Replicate()]})


def _shard_files(path, name):
    """The shard (or chunk) files of array ``name`` of the Zarr store at ``path``, sorted."""
    found = glob.glob(os.path.join(path, *name.split("/"), "c", "**"), recursive=True)
    found += glob.glob(os.path.join(path, *name.split("/"), "c"))
    return sorted({f for f in found if os.path.isfile(f)})


def test_zarr_damaged_shard_names_the_array(comm, shared_dir, monkeypatch):
    """A truncated shard of a pyshard Zarr checkpoint raises the same ValueError on every
    rank, naming where, with the direct reader or through zarr-python (whose own message, a
    bare "Stored and computed checksum do not match", was passed on without file or array)."""
    need("zarr")
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size + 4, 3), "float64", seed=3)
    path = os.path.join(shared_dir, "d.zarr")
    ps.save(path, {"w": ps.distribute(g, mesh, [Shard(0)])}, format="zarr")

    def damage():
        f = _shard_files(path, "w")[-1]
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
        return f

    shard = on_rank0(comm, damage)
    for direct, where in (("1", repr(shard)), ("0", f"{os.path.join(path, 'w')!r}: array 'w'")):
        monkeypatch.setenv("PYSHARD_ZARR_DIRECT", direct)
        with pytest.raises(ValueError) as ei:
            ps.load(path, mesh, {"w": [Shard(1)]})
        assert same_error(comm, str(ei.value), f"load: {where}: ") == [], direct
    mesh.free()


def test_zarr_missing_shard_raises_on_every_rank(comm, shared_dir, monkeypatch):
    """A shard file missing from pyshard's own Zarr checkpoint (its save wrote every shard)
    raises the same FileNotFoundError naming the file on every rank, before any data is read,
    whichever rank's shard it is (the last rank's, the first's, a 0-d array's one chunk), with
    the direct reader or through zarr-python; the checkpoint's other arrays still load, and
    the direct reader refuses one removed after the check. In another tool's store a chunk
    never written (or removed) is the fill value, as Zarr says."""
    need("zarr")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    specs = {
        "w": spec((4 * p + 1, 3), "float64", 11, ["S(0)"]),  # row shards, at most one per rank
        "k": spec((3, 2 * p), "int32", 12, ["S(1)"]),  # the boxes are the shard grid
        "s": spec((), "float64", 13, ["R"]),
        "e": spec((0, 3), "float32", 14, ["S(0)"]),  # no element: no shard
    }
    base = os.path.join(shared_dir, "base.zarr")
    ps.save(base, {n: make_sharded(mesh, s) for n, s in specs.items()}, format="zarr")
    files = on_rank0(comm, lambda: {n: _shard_files(base, n) for n in specs})
    assert files["e"] == [] and len(files["s"]) == 1 and len(files["k"]) == p, files
    want = {"w": [Shard(1)], "k": [Shard(0)], "s": [Replicate()], "e": [Shard(0)]}
    for i, (name, victim) in enumerate(
        (("w", files["w"][-1]), ("k", files["k"][0]), ("s", files["s"][0]))
    ):
        path = os.path.join(shared_dir, f"gone{i}.zarr")
        gone = victim.replace(base, path, 1)

        def remove(path=path, gone=gone):
            shutil.copytree(base, path)
            os.remove(gone)

        on_rank0(comm, remove)
        for direct in ("1", "0"):
            monkeypatch.setenv("PYSHARD_ZARR_DIRECT", direct)
            with pytest.raises(FileNotFoundError) as ei:
                ps.load(path, mesh, want)
            assert str(ei.value).startswith(
                f"load: array {name!r}: its shard file {gone!r} is missing (the pyshard "
                f"checkpoint's save wrote it)"
            ), str(ei.value)
            assert "missing_as_fill=True" in str(ei.value)
        monkeypatch.setenv("PYSHARD_ZARR_DIRECT", "1")
        # the others load, and the description needs no data
        rest = {n: pl for n, pl in want.items() if n != name}
        out = ps.load(path, mesh, rest)
        for n, y in out.items():
            np.testing.assert_array_equal(y.local, global_of(specs[n])[y.box])
        assert sorted(ps.checkpoint_info(path)["arrays"]) == sorted(specs)
    # a shard removed after rank 0's check: the direct reader raises rather than fill
    arrays, _ = ZarrFormat().describe(os.path.join(shared_dir, "gone0.zarr"), "test")
    assert arrays["w"]["saved"]
    with pytest.raises(ValueError, match="a shard file of a pyshard checkpoint is missing"):
        zarr_read.read_rows(arrays["w"], 0, 0, 4 * p + 1, np.dtype("float64"))

    # another tool's store: a missing chunk is the fill value
    g = np.arange(24, dtype="f4").reshape(6, 4)

    def foreign():
        import zarr

        f = os.path.join(shared_dir, "tool.zarr")
        grp = zarr.open_group(f, mode="w")
        grp.create_array("x", shape=g.shape, dtype=g.dtype, chunks=(2, 2), fill_value=7)[...] = g
        os.remove(os.path.join(f, "x", "c", "2", "1"))
        return f

    f = on_rank0(comm, foreign)
    out = ps.load(f, mesh, {"x": [Shard(0)]})
    w = g.copy()
    w[4:6, 2:4] = 7
    np.testing.assert_array_equal(out["x"].local, w[out["x"].box])


def test_zarr_write_error_names_the_rank(comm, shared_dir):
    """A shard write that fails on one rank (the last; a file size limit: EFBIG) raises the
    same ValueError on every rank, naming the array and the rank as the other formats do;
    the previous checkpoint stays, and no temporary directory is left. (Zarr shards are
    written with plain file writes, not MPI-IO: any MPI library.)"""
    need("zarr")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = global_of(spec((4 * p, 1024), "float32", 7, ["S(0)"]))
    x = ps.distribute(g, mesh, [Shard(0)])  # four rows, one 16 KiB shard, per rank
    path = os.path.join(shared_dir, "wfail.zarr")
    ps.save(path, {"old": x}, {"v": 1}, format="zarr")
    comm.Barrier()
    last = p - 1
    msg = save_limited(comm, last, 8192,
                       lambda: ps.save(path, {"new": x, "newer": x}, {"v": 2}, format="zarr"))
    failures = same_error(
        comm, msg, f"ValueError: save({path!r}): array 'new': rank {last}: OSError({errno.EFBIG}, ")
    info = ps.checkpoint_info(path)
    if info["metadata"] != {"v": 1} or sorted(info["arrays"]) != ["old"]:
        failures.append(f"the previous checkpoint was replaced: {info}")
    out = ps.load(path, mesh, {"old": [Replicate()]})
    if not np.array_equal(out["old"].local, g):
        failures.append("the previous checkpoint's data differs")
    left = on_rank0(comm, lambda: glob.glob(path + ".tmp-*"))
    if left:
        failures.append(f"temporary directories left: {left}")
    agree(comm, failures)


# ----------------------------------------------------------------------------- concurrency


def test_zarr_concurrent_writes(comm, shared_dir):
    """Rounds of saving layouts whose boxes cut across row shards (Shard(1) of an uneven
    split: redistributed to whole row shards first) end with every byte right; an even
    Shard(1) split (and a 2-D grid) becomes the shard grid itself, one shard per box."""
    need("zarr")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    a, b = next(((d, p // d) for d in (2, 3) if p % d == 0 and p > d), (1, p))
    mesh2 = ps.Mesh(comm, (a, b))
    shape = (4 * p + 3, 2 * p + 1)  # uneven columns: not a shard grid
    even = (5, 2 * p)  # two columns per rank: the shard grid is the boxes
    grid2 = (2 * a + 1, 3 * b)
    path = os.path.join(shared_dir, "conc.zarr")
    lost = 0
    for r in range(3):
        g = global_of(spec(shape, "float32", 100 + r, ["S(1)"]))
        h = global_of(spec(even, "int32", 200 + r, ["S(1)"]))
        k = global_of(spec(grid2, "float64", 300 + r, ["S(0)", "S(1)"]))
        arrays = {
            "x": ps.distribute(g, mesh, [Shard(1)]),
            "y": ps.distribute(h, mesh, [Shard(1)]),
            "z": ps.distribute(k, mesh2, [Shard(0), Shard(1)], {0: [2] * (a - 1) + [3]}
                               if a > 1 else None),
        }
        ps.save(path, arrays, format="zarr")

        def count(g=g, h=h, k=k):
            import zarr

            grp = zarr.open_group(path, mode="r")
            assert list(grp["y"].metadata.chunk_grid.chunk_shape) == [5, 2]
            return sum(int(np.sum(grp[n][...] != w)) for n, w in (("x", g), ("y", h), ("z", k)))

        lost += on_rank0(comm, count)
        out = ps.load(path, mesh, {"z": [Shard(0)]})
        np.testing.assert_array_equal(out["z"].local, k[out["z"].box])
    assert lost == 0


def _read_then_write_store(marks, rank, writers):
    """A zarr-python LocalStore class whose shard writes wait until ``writers`` ranks have
    read that shard (marks: one empty file per rank and shard in directory ``marks``): it
    fixes the schedule of zarr-python's read-modify-write of a shard so that every writer
    reads it before any writes it, the interleaving that concurrent runs hit by chance.
    It changes no byte zarr-python reads or writes."""
    import asyncio
    import time

    from zarr.storage import LocalStore

    class ReadThenWrite(LocalStore):
        async def get(self, key, prototype, byte_range=None):
            v = await super().get(key, prototype, byte_range)
            if key.startswith("c/") and byte_range is None:  # a whole shard, to be merged
                open(os.path.join(marks, f"{key.replace('/', '_')}.{rank}"), "w").close()
            return v

        async def set(self, key, value):
            if key.startswith("c/"):
                pattern = os.path.join(marks, f"{key.replace('/', '_')}.*")
                t = time.monotonic()
                while len(glob.glob(pattern)) < writers and time.monotonic() - t < 30:
                    await asyncio.sleep(0.002)
            await super().set(key, value)

    return ReadThenWrite


def test_zarr_python_partial_writes_lose_data(comm, shared_dir):
    """The other half of the concurrent-write check, on the layout of
    test_zarr_concurrent_writes' ``x`` (Shard(1) of uneven columns) and pyshard's shard and
    chunk shapes for it (row shards spanning every rank's columns): rounds of every rank
    writing its box with zarr-python's own partial writes into one sharded array lose data
    (zarr-python issue 3683: each write reads the shard, merges its region and writes the
    whole shard back), while pyshard's saves of the same arrays lose nothing. Left to chance
    the loss is not certain in every round (24 of 30 rounds at 2 ranks here), so a store
    fixes the schedule: every writer reads a shard before any writes it
    (:func:`_read_then_write_store`); then at most one writer's columns survive in each
    shard."""
    need("zarr")
    import zarr

    p = comm.size
    if p == 1:
        pytest.skip("one writer: nothing concurrent")
    mesh = ps.Mesh(comm, (p,))
    shape = (4 * p + 3, 2 * p + 1)
    meta = zarr_meta.array_meta(shape, np.dtype("float32"), p, None)
    shards = meta["chunk_grid"]["configuration"]["chunk_shape"]
    chunks = meta["codecs"][0]["configuration"]["chunk_shape"]
    assert shards[1] == shape[1] and shards[0] < shape[0], "every shard spans every column"
    lost_zarr, lost_pyshard = [], []
    for r in range(3):
        g = global_of(spec(shape, "float32", 400 + r, ["S(1)"]))
        g[g == 0] = 1  # no element equal to the fill value: every lost one shows
        x = ps.distribute(g, mesh, [Shard(1)])
        ext = x.layout.sizes[1]
        writers = sum(1 for e in ext if e > 0)
        ps.save(os.path.join(shared_dir, "ps.zarr"), {"x": x}, format="zarr")
        path = os.path.join(shared_dir, f"zp{r}.zarr")
        marks = os.path.join(shared_dir, f"marks{r}")
        if comm.rank == 0:
            os.mkdir(marks)
            zarr.create_array(
                path, shape=shape, dtype="float32", chunks=chunks, shards=shards, compressors=None
            )
        comm.Barrier()
        store = _read_then_write_store(marks, comm.rank, writers)(path)
        a = zarr.open_array(store=store, mode="r+")
        if x.local.size:
            a[x.box] = x.local
        comm.Barrier()

        def count(g=g, path=path):
            ours = zarr.open_group(os.path.join(shared_dir, "ps.zarr"), mode="r")["x"][...]
            theirs = zarr.open_array(path, mode="r")[...]
            return int(np.sum(ours != g)), int(np.sum(theirs != g))

        ours, theirs = on_rank0(comm, count)
        lost_pyshard.append(ours)
        lost_zarr.append(theirs)
        # at most one writer's columns survive in each shard
        assert theirs >= shape[0] * (shape[1] - max(ext)), (r, theirs)
    assert lost_pyshard == [0, 0, 0]
    assert all(n > 0 for n in lost_zarr)


# ----------------------------------------------------------------------------- bad files


def _bad_safetensors(d):
    """Rank 0: untrusted safetensors files; [(path, error pattern)]."""
    out = []

    def write(name, header, data=b"", raw_len=None):
        f = os.path.join(d, name)
        body = json.dumps(header).encode() if isinstance(header, dict) else header
        with open(f, "wb") as fh:
            fh.write(struct.pack("<Q", len(body) if raw_len is None else raw_len))
            fh.write(body)
            fh.write(data)
        return f

    ok = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    out.append((write("huge_header.st", {"x": ok}, bytes(16), raw_len=1 << 40), "over the"))
    out.append((write("outside.st", {"x": dict(ok, data_offsets=[8, 24])}, bytes(16)),
                "outside"))
    out.append((write("truncated.st", {"x": ok}, bytes(10)), "outside"))
    out.append((write("overlap.st", {"x": ok, "y": dict(ok, data_offsets=[8, 24])}, bytes(24)),
                "overlap"))
    out.append((write("dtype.st", {"x": dict(ok, dtype="F7")}, bytes(16)), "dtype 'F7'"))
    out.append((write("shape.st", {"x": dict(ok, shape=[1 << 40, 1 << 40])}, bytes(16)),
                "needs"))
    out.append((write("json.st", b"{nope", bytes(16)), "not JSON"))
    return out


def test_bad_safetensors_on_every_rank(comm, shared_dir):
    mesh = ps.Mesh(comm, (comm.size,))
    cases = on_rank0(comm, lambda: _bad_safetensors(shared_dir))
    for f, match in cases:
        with pytest.raises(ValueError, match=match) as ei:
            ps.load(f, mesh, {"x": [Shard(0)]})
        assert f in str(ei.value)
    with pytest.raises(TypeError, match="safetensors cannot hold"):
        ps.save(os.path.join(shared_dir, "u.st"),
                {"x": ps.distribute(np.zeros(3, ">f4"), mesh, [Replicate()])},
                format="safetensors")
    with pytest.raises(ValueError, match="neither HDF5 nor safetensors"):
        ps.load(on_rank0(comm, lambda: _text(shared_dir)), mesh, {"x": [Shard(0)]})
    # still in step
    g = np.arange(6.0)
    f = os.path.join(shared_dir, "good.safetensors")
    ps.save(f, {"x": ps.distribute(g, mesh, [Shard(0)])}, format="safetensors")
    out = ps.load(f, mesh, {"x": [Replicate()]})
    np.testing.assert_array_equal(out["x"].local, g)


def test_names_a_format_cannot_hold(comm, shared_dir):
    """Names a format would save but never read back raise the same ValueError on every rank
    before anything is written, and the previous checkpoint stays: safetensors'
    ``__metadata__`` (its header's metadata key); for HDF5 and Zarr, a name that is the group
    of another (``a`` and ``a/b``) or holds a NUL, and a Zarr name with a ``zarr.json`` part
    (a node's metadata file). Names that share a group or a prefix save."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(24.0).reshape(6, 4)
    x = ps.distribute(g, mesh, [Shard(0)])
    groups = available(("hdf5", "zarr"))
    cases = [("safetensors", ["__metadata__", "y"], "no tensor may be called '__metadata__'")]
    for fmt in groups:
        label = formats.DRIVERS[fmt].label.split()[0]
        cases.append((fmt, ["a", "a/b"],
                      rf"'a' is an array, so it cannot also be the {label} group holding 'a/b'"))
        cases.append((fmt, ["a/b", "a/b/c/d", "z"],
                      rf"'a/b' is an array, so it cannot also be the {label} group holding "
                      rf"'a/b/c/d'"))
        # a NUL (HDF5 cut 'w\x00a' to 'w': saved under another name, and two such names
        # collided as "name already exists")
        cases.append((fmt, ["w\x00a", "y"], "NUL character"))
    if "zarr" in groups:  # (a directory named zarr.json: the save failed as an OSError)
        cases.append(("zarr", ["g/zarr.json", "y"], "'zarr.json'"))
    for i, (fmt, names, match) in enumerate(cases):
        path = os.path.join(shared_dir, f"old{i}" + EXT[fmt])
        ps.save(path, {"old": x}, format=fmt)
        with pytest.raises(ValueError, match=match):
            ps.save(path, dict.fromkeys(names, x), format=fmt)
        assert sorted(ps.checkpoint_info(path)["arrays"]) == ["old"], (fmt, names)
        assert glob.glob(path + ".tmp-*") == []
        out = ps.load(path, mesh, {"old": [Replicate()]})
        np.testing.assert_array_equal(out["old"].local, g)
    names = ["a/x", "a/y", "ab", "a_b/c"]
    for fmt in groups:
        path = os.path.join(shared_dir, "fine" + EXT[fmt])
        ps.save(path, dict.fromkeys(names, x), format=fmt)
        assert sorted(ps.checkpoint_info(path)["arrays"]) == sorted(names), fmt
        out = ps.load(path, mesh, dict.fromkeys(names, [Shard(1)]))
        for n in names:
            np.testing.assert_array_equal(out[n].local, g[out[n].box])


def test_safetensors_holding_an_hdf5_signature(comm, shared_dir):
    """A safetensors file whose data holds an HDF5 signature where HDF5 allows one (byte
    512, after a user block) is detected, described and loaded as safetensors: its header
    is checked whole, before the HDF5 signature; an HDF5 file whose user block only starts
    like a safetensors header is HDF5."""
    mesh = ps.Mesh(comm, (comm.size,))
    blob = np.frombuffer(hdf5_format.SIGNATURE + bytes(range(56)), np.uint8)

    def write():
        f = os.path.join(shared_dir, "blob.safetensors")
        body = json.dumps({"blob": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}})
        body = body.encode().ljust(512 - 8)  # the data starts at byte 512
        with open(f, "wb") as fh:
            fh.write(struct.pack("<Q", len(body)) + body + blob.tobytes())
        return f

    f = on_rank0(comm, write)
    assert hdf5_format.is_hdf5(f)  # what made it look like an HDF5 file
    assert formats.detect(f, "test").name == "safetensors"
    info = ps.checkpoint_info(f)
    assert info["format"] == "safetensors" and info["arrays"]["blob"]["shape"] == (64,)
    out = ps.load(f, mesh, {"blob": [Shard(0)]})
    np.testing.assert_array_equal(out["blob"].local, blob[out["blob"].box])
    # and an HDF5 file whose user block starts like a safetensors header (a length, then
    # "{") but holds none is HDF5
    try:
        need("hdf5")
    except pytest.skip.Exception:
        return

    def write_h5():
        import h5py

        f = os.path.join(shared_dir, "userblock.h5")
        with h5py.File(f, "w", userblock_size=512) as h5:
            h5["x"] = np.arange(5.0)
        with open(f, "r+b") as fh:
            fh.write(struct.pack("<Q", 100) + b"{not a header")
        return f

    f = on_rank0(comm, write_h5)
    assert formats.detect(f, "test").name == "hdf5"
    out = ps.load(f, mesh, {"x": [Replicate()]})
    np.testing.assert_array_equal(out["x"].local, np.arange(5.0))


def _text(d):
    f = os.path.join(d, "notes.txt")
    with open(f, "w") as fh:
        fh.write("hello, not a checkpoint\n")
    return f


def _bad_hdf5(d):
    import h5py

    out = []
    f = os.path.join(d, "trunc.h5")
    with h5py.File(f, "w") as h5:
        h5["x"] = np.arange(4096.0)
    os.truncate(f, os.path.getsize(f) - 4096)
    out.append((f, "truncated|outside"))
    f = os.path.join(d, "strings.h5")
    with h5py.File(f, "w") as h5:
        h5["x"] = np.array([b"ab", b"cd"])
    out.append((f, "cannot hold|not one pyshard can hold"))
    f = os.path.join(d, "huge.h5")
    with h5py.File(f, "w") as h5:
        h5.create_dataset("x", shape=(1 << 40, 1 << 20), dtype="f8", chunks=(1, 1024))
    out.append((f, "too large"))
    return out


def test_bad_hdf5_on_every_rank(comm, shared_dir):
    need("hdf5")
    mesh = ps.Mesh(comm, (comm.size,))
    for f, match in on_rank0(comm, lambda: _bad_hdf5(shared_dir)):
        with pytest.raises(ValueError, match=match) as ei:
            ps.load(f, mesh, {"x": [Shard(0)]})
        assert f in str(ei.value)


def _bad_zarr(d):
    import zarr

    out = []
    base = os.path.join(d, "zbase.zarr")
    g = zarr.open_group(base, mode="w")
    a = g.create_array("x", shape=(6, 4), dtype="f4", chunks=(2, 2))
    a[...] = 1

    def variant(name, edit):
        p = os.path.join(d, name)
        shutil.copytree(base, p)
        edit(p)
        out.append(p)
        return p

    def meta_edit(fn):
        def edit(p):
            f = os.path.join(p, "x", "zarr.json")
            with open(f) as fh:
                m = json.load(fh)
            fn(m)
            with open(f, "w") as fh:
                json.dump(m, fh)
        return edit

    cases = []
    cases.append((variant("codec.zarr", meta_edit(lambda m: m["codecs"].append({"name": "rot13"}))),
                  "unknown codec 'rot13'"))
    cases.append((variant("dtype.zarr", meta_edit(lambda m: m.update(data_type="string"))),
                  "data_type 'string'"))
    cases.append((variant("huge.zarr", meta_edit(lambda m: m.update(shape=[1 << 40, 1 << 30]))),
                  "too large"))

    def escape(p):
        f = os.path.join(p, "zarr.json")
        with open(f) as fh:
            m = json.load(fh)
        m["consolidated_metadata"] = {"kind": "inline", "must_understand": False,
                                      "metadata": {"../../etc": {}}}
        with open(f, "w") as fh:
            json.dump(m, fh)

    cases.append((variant("escape.zarr", escape), "escapes the directory"))

    def link(p):
        os.symlink(os.path.dirname(d), os.path.join(p, "x", "c", "out"))

    cases.append((variant("link.zarr", link), "escapes the directory"))
    return cases


def test_bad_zarr_on_every_rank(comm, shared_dir):
    need("zarr")
    mesh = ps.Mesh(comm, (comm.size,))
    for f, match in on_rank0(comm, lambda: _bad_zarr(shared_dir)):
        with pytest.raises(ValueError, match=match) as ei:
            ps.load(f, mesh, {"x": [Shard(0)]})
        assert f in str(ei.value) or "zarr.json" in str(ei.value)


def test_non_finite_metadata_refused(comm, shared_dir):
    """NaN and infinite floats in ``metadata`` (which json.dumps writes as the non-standard
    NaN and Infinity) raise the same ValueError on every rank, naming where they are,
    before anything is written, in every format; the previous checkpoint stays. What a save
    writes is standard JSON."""
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(np.arange(6.0), mesh, [Shard(0)])
    cases = [
        ({"lr": float("nan")}, "metadata['lr'] = nan"),
        ({"hist": [1.0, float("inf")]}, "metadata['hist'][1] = inf"),
        ({"a": {"b": (0.5, np.float64("-inf"))}}, "metadata['a']['b'][1] = -inf"),
    ]
    for fmt in available(formats.FORMATS):
        path = os.path.join(shared_dir, "meta-" + fmt + EXT.get(fmt, ""))
        ps.save(path, {"x": x}, {"v": 1.5}, format=fmt)
        for meta, where in cases:
            with pytest.raises(ValueError) as ei:
                ps.save(path, {"x": x}, meta, format=fmt)
            assert str(ei.value) == (
                f"save(metadata): holds a non-finite float ({where}): NaN and Infinity are "
                f"not standard JSON; store them as strings or None"
            ), str(ei.value)
            with pytest.raises(ValueError, match="non-finite"):
                ps.save(os.path.join(shared_dir, "never-" + fmt), {"x": x}, meta, format=fmt)
        assert ps.checkpoint_info(path)["metadata"] == {"v": 1.5}, fmt
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            ps.save(path, {"x": x}, {"f": object()}, format=fmt)
    assert on_rank0(comm, lambda: [n for n in os.listdir(shared_dir) if "meta-" not in n]) == []

    def strict():
        def refuse(c):
            raise ValueError(f"non-standard JSON constant {c}")

        files = [os.path.join(shared_dir, "meta-npy", "manifest.json")]
        if "zarr" in available(["zarr"]):
            files.append(os.path.join(shared_dir, "meta-zarr.zarr", "zarr.json"))
        got = []
        for f in files:
            with open(f) as fh:
                got.append(json.load(fh, parse_constant=refuse))
        return [got[0]["metadata"]] + [m["attributes"]["pyshard"]["metadata"] for m in got[1:]]

    assert all(m == {"v": 1.5} for m in on_rank0(comm, strict))


def test_zarr_v2_store_and_empty_directory_named(comm, shared_dir):
    """A directory no format claims says what it is: a Zarr v2 store (``.zgroup``,
    ``.zarray``) raises ValueError saying pyshard reads Zarr v3 only, an empty directory
    FileNotFoundError saying it is empty (load and checkpoint_info, every rank alike); any
    other directory still has no manifest. An empty directory may still be a save's target."""
    mesh = ps.Mesh(comm, (comm.size,))

    def make():
        out = {}
        grp = os.path.join(shared_dir, "v2group.zarr")
        os.makedirs(os.path.join(grp, "x"))
        with open(os.path.join(grp, ".zgroup"), "w") as f:
            json.dump({"zarr_format": 2}, f)
        with open(os.path.join(grp, "x", ".zarray"), "w") as f:
            json.dump({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<f8"}, f)
        out["v2group"] = grp
        arr = os.path.join(shared_dir, "v2array.zarr")
        shutil.copytree(os.path.join(grp, "x"), arr)
        out["v2array"] = arr
        try:
            import zarr
        except ImportError:
            pass
        else:
            tool = os.path.join(shared_dir, "v2tool.zarr")
            z = zarr.open_group(tool, mode="w", zarr_format=2)
            z.create_array("x", shape=(4,), dtype="f8", chunks=(2,))[...] = np.arange(4.0)
            out["v2tool"] = tool
        out["empty"] = os.path.join(shared_dir, "empty.zarr")
        os.mkdir(out["empty"])
        out["other"] = os.path.join(shared_dir, "other")
        os.mkdir(out["other"])
        open(os.path.join(out["other"], "notes.txt"), "w").close()
        return out

    paths = on_rank0(comm, make)
    for key, p in paths.items():
        if key.startswith("v2"):
            exc, match = ValueError, r"is a Zarr v2 store \(\.z.*pyshard reads Zarr v3 only"
        elif key == "empty":
            exc, match = FileNotFoundError, "is an empty directory: no checkpoint"
        else:
            exc, match = FileNotFoundError, r"has no manifest\.json"
        with pytest.raises(exc, match=match) as ei:
            ps.load(p, mesh, {"x": [Shard(0)]})
        assert repr(p) in str(ei.value)
        with pytest.raises(exc, match=match):
            ps.checkpoint_info(p)
    for fmt in available(["npy", "zarr"]):
        empty = os.path.join(shared_dir, "empty-" + fmt)
        on_rank0(comm, lambda empty=empty: os.mkdir(empty))
        ps.save(empty, {"x": ps.distribute(np.arange(4.0), mesh, [Shard(0)])}, format=fmt)
        assert ps.checkpoint_info(empty)["format"] == fmt


def test_missing_package_names_the_extra(comm, shared_dir, monkeypatch):
    """A format whose package is missing raises ImportError naming the extra, on every rank."""
    need("hdf5")
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(np.arange(4.0), mesh, [Shard(0)])
    f = os.path.join(shared_dir, "x.h5")
    ps.save(f, {"x": x}, format="hdf5")
    for mod in (hdf5_format.h5py, zarr_meta.zarr):
        monkeypatch.setattr(mod, "module", None)
        monkeypatch.setattr(mod, "tried", True)
    with pytest.raises(ImportError, match=r"pyshard\[hdf5\]"):
        ps.save(os.path.join(shared_dir, "y.h5"), {"x": x}, format="hdf5")
    with pytest.raises(ImportError, match=r"pyshard\[zarr\]"):
        ps.save(os.path.join(shared_dir, "y.zarr"), {"x": x}, format="zarr")
    with pytest.raises(ImportError, match=r"pyshard\[hdf5\]"):
        ps.load(f, mesh, {"x": [Shard(0)]})


# ----------------------------------------------------------------------------- drivers


class ToyFormat(Format):
    """A format of the test's own, one class registered in the table: a directory with
    ``toy.json`` (name -> shape, dtype) and one raw C-order file per array, which rank 0 writes
    from a replicated copy; the prepare and commit are the shared ones."""

    name = "toy"
    label = "toy"
    target = "a toy checkpoint"

    def probe(self, path):
        return os.path.isfile(os.path.join(path, "toy.json"))

    def replaceable(self, path):
        return self.probe(path)

    def describe(self, path, what):
        with open(os.path.join(path, "toy.json")) as f:
            table = json.load(f)
        arrays = {}
        for n, (shape, dt) in table.items():
            dtype = np.dtype(dt)
            arrays[n] = {
                "shape": tuple(shape), "dtype": dtype,
                "nbytes": int(np.prod(shape)) * dtype.itemsize,
                "file": os.path.join(path, n + ".bin"), "kind": "raw", "offset": 0,
                "mesh_shape": (), "placements": [], "sizes": {},
            }  # fmt: skip
        return arrays, {"version": None, "ranks": None, "created": None, "metadata": {}}

    def save(self, comm, path, items, meta_json, sync, compression):
        def prepare():
            parent = saving.check_target(path, self)
            tmp, token = saving.temporary(path)
            os.mkdir(tmp)
            return tmp, parent, token

        tmp, parent, token = saving.prepare(comm, path, prepare)
        for name, x in items:
            whole = x.redistribute([Replicate()] * len(x.layout.mesh_shape)).local
            if comm.rank == 0:
                np.ascontiguousarray(whole).tofile(os.path.join(tmp, name + ".bin"))

        def commit(_):
            with open(os.path.join(tmp, "toy.json"), "w") as f:
                json.dump({n: [list(x.global_shape), x.dtype.str] for n, x in items}, f)
            saving.swap_in(tmp, path, parent, token, sync)

        saving.finish(comm, path, tmp, None, None, commit)


def test_a_format_is_one_driver_in_the_table(comm, shared_dir, monkeypatch):
    """A format registered in the driver table alone is saved, detected, described and
    loaded into any layout (direct and collective reads) by ps.save, ps.load and
    ps.checkpoint_info; its save target is checked by the one shared check, with the
    format's own words; unregistered, the same path is no checkpoint."""
    mesh = ps.Mesh(comm, (comm.size,))
    s = spec((2 * comm.size + 1, 3), "float32", 5, ["S(0)"])
    path = os.path.join(shared_dir, "toy")
    with monkeypatch.context() as m:
        m.setitem(formats.DRIVERS, "toy", ToyFormat())
        ps.save(path, {"x": make_sharded(mesh, s)}, format="toy")
        info = ps.checkpoint_info(path)
        assert info["format"] == "toy" and info["arrays"]["x"]["shape"] == (2 * comm.size + 1, 3)
        for pl, limit in (([Shard(1)], 0), ([Shard(0)], 1 << 62), ([Replicate()], 0)):
            with ps.config.override(PYSHARD_LOAD_DIRECT_BYTES=limit):
                out = ps.load(path, mesh, {"x": pl})
            np.testing.assert_array_equal(out["x"].local, global_of(s)[out["x"].box])
        other = os.path.join(shared_dir, "plain.txt")
        on_rank0(comm, lambda: open(other, "w").close())
        with pytest.raises(ValueError, match=r"plain\.txt.*: it exists and is not a toy "):
            ps.save(other, {"x": make_sharded(mesh, s)}, format="toy")
    with pytest.raises(ValueError, match="expected one of"):
        ps.save(path, {"x": make_sharded(mesh, s)}, format="toy")
    with pytest.raises(FileNotFoundError, match="manifest"):
        ps.checkpoint_info(path)


def test_each_format_probes_its_own_checkpoints(comm, shared_dir):
    """Every driver in the table claims the checkpoints its format saves and no other's, and
    checkpoint_info names the format saved."""
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(np.arange(6.0), mesh, [Shard(0)])
    paths = {}
    for name in available(formats.FORMATS):
        paths[name] = os.path.join(shared_dir, "p-" + name)
        ps.save(paths[name], {"x": x}, format=name)
    assert "npy" in paths and "safetensors" in paths
    for name, p in paths.items():
        claims = [d.name for d in formats.DRIVERS.values() if d.probe(p)]
        assert claims == [name], (p, claims)
        assert ps.checkpoint_info(p)["format"] == name


# ----------------------------------------------------------------------------- subprocesses


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_cross_sizes_and_killed_saves(comm, shared_dir):
    """Save on 3 ranks, load on 1 (every format; the in-process tests load other rank
    counts); a save killed after its data (or, for HDF5, before its rename) leaves the
    previous file or directory intact, in every format. Four launches in all (CI budget)."""
    needs_subprocess(comm)
    fmts = ["safetensors"] + available(("hdf5", "zarr"))
    d = shared_dir
    src = {
        "w": spec((7, 5), "float32", 1, ["S(1)"], {1: [3, 0, 2]}),
        "b": spec((4,), "int64", 2, ["P(sum)"]),
    }
    tgt = {"w": dict(src["w"], placements=["S(0)"]), "b": dict(src["b"], placements=["R"])}
    tgt["w"].pop("sizes")
    paths = {fmt: os.path.join(d, "x" + EXT[fmt]) for fmt in fmts}
    mpirun(3, [{"op": "save", "path": p, "mesh": [3], "arrays": src, "format": f}
               for f, p in paths.items()])
    mesh1 = ps.Mesh(comm, (1,))
    for fmt, p in paths.items():
        out = ps.load(p, mesh1, {"w": [Shard(1)], "b": [Replicate()]})
        assert check_all(out, tgt, f"{fmt} 3 -> 1: ") == []
    new = {"w": spec((7, 5), "float32", 9, ["S(0)"]), "z": spec((3,), "int32", 3, ["R"])}
    for fmt, p in paths.items():
        fault = "save-before-rename:0" if fmt == "hdf5" else "save-after-data:1"
        job = {"op": "save", "path": p, "mesh": [2], "arrays": new, "format": fmt}
        r = mpirun(2, [job], env={"CKPT_FAULT": fault}, expect_ok=False)
        assert r.returncode != 0, f"{fmt} {fault}: the save should have died\n{r.stderr}"
        assert sorted(ps.checkpoint_info(p)["arrays"]) == ["b", "w"], (fmt, fault)
        out = ps.load(p, mesh1, {"w": [Replicate()], "b": [Replicate()]})
        assert check_all(out, tgt, f"{fmt} {fault}: ") == []
        leftovers = glob.glob(p + ".tmp-*")
        assert leftovers, f"{fmt}: a killed save leaves its temporary file"
        for t in leftovers:
            shutil.rmtree(t) if os.path.isdir(t) else os.remove(t)


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "safetensors", "zarr"])
@pytest.mark.parametrize("replaced", ["shape", "dtype"])
def test_save_of_a_replaced_local(comm, shared_dir, replaced, fmt):
    """One rank's .local replaced by an array of another shape or dtype (float64 -> int64,
    the same item size), without the validation mode: every rank raises, naming that rank,
    and nothing is written. The HDF5 save wrote the int64 bytes as float64 (a wrong
    checkpoint, no error); the npy save wrote one that its load then called corrupt."""
    if fmt != "npy":
        need(fmt)
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size, 4), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    last = comm.size - 1
    if comm.rank == last:
        x.local = x.local[:-1] if replaced == "shape" else x.local.astype(np.int64)
    path = os.path.join(shared_dir, f"ck-{replaced}{EXT.get(fmt, '')}")
    with pytest.raises(ValueError) as e:
        ps.save(path, {"a": x}, format=fmt)
    msg = str(e.value)
    assert comm.allgather(msg) == [msg] * comm.size
    for needle in (f"rank {last}", "array 'a'", "was .local replaced", "nothing was written"):
        assert needle in msg, msg
    comm.Barrier()
    assert not os.path.exists(path)
    assert not [f for f in os.listdir(shared_dir) if "tmp" in f]
    mesh.free()


def test_load_errors_name_the_array(comm, shared_dir):
    """A target placement or sizes= that one array of a load cannot take: the error names
    that array (it said only "placements[0] = Shard(dim=2): dim out of range")."""
    mesh = ps.Mesh(comm, (comm.size,))
    path = os.path.join(shared_dir, "named")
    x = ps.distribute(np.zeros((8, 2)), mesh, [Shard(0)])
    ps.save(path, {"v": x, "w": x})
    with pytest.raises(ValueError, match=r"load: array 'w' \(shape \(8, 2\)\): placements"):
        ps.load(path, mesh, {"v": [Shard(0)], "w": [Shard(2)]})
    with pytest.raises(ValueError, match=r"load: array 'w' \(shape \(8, 2\)\): sizes\[0\]"):
        ps.load(path, mesh, {"v": [Shard(0)], "w": [Shard(0)]},
                sizes={"w": {0: [3] * comm.size}})
    mesh.free()


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "safetensors", "zarr"])
def test_a_failed_reduction_step_names_the_array_and_cleans_up(comm, shared_dir, fmt,
                                                                monkeypatch):
    """An array's collective step before its write (the reduction of a Partial array)
    raising on every rank: the error names the save and the array, the temporary is
    removed and the earlier checkpoint stays. HDF5, Zarr and safetensors raised the bare
    error and left path.tmp-<token> behind (the npy save already did this)."""
    if fmt != "npy":
        need(fmt)
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(12.0).reshape(6, 2)
    x = ps.distribute(g, mesh, [Shard(0)])
    path = os.path.join(shared_dir, "step" + EXT.get(fmt, ""))
    ps.save(path, {"old": x}, format=fmt)
    part = ps.from_local(g.copy(), mesh, [ps.Partial("sum")], global_shape=g.shape)
    real = ps.ShardedArray.redistribute

    def refused(self, *args, **kwargs):
        if self.layout.partial_mesh_dims():
            raise ValueError("the reduction step refused")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ps.ShardedArray, "redistribute", refused)
    with pytest.raises(ValueError) as e:
        ps.save(path, {"a": x, "p": part}, format=fmt)
    msg = str(e.value)
    assert comm.allgather(msg) == [msg] * comm.size
    assert f"save({path!r}): array 'p'" in msg and "the reduction step refused" in msg, msg
    monkeypatch.undo()
    comm.Barrier()
    assert glob.glob(path + ".tmp-*") == []
    assert sorted(ps.checkpoint_info(path)["arrays"]) == ["old"]
    np.testing.assert_array_equal(ps.load(path, mesh, {"old": [Replicate()]})["old"].local, g)
    mesh.free()


def test_a_save_to_a_symlink_replaces_the_link(comm, shared_dir):
    """A save to a path that is a symbolic link (``latest -> step-1``) replaces the link with
    the new checkpoint and leaves the one it pointed at as it was, in every format; the
    directory formats left the link behind as ``latest.old-<token>`` (rmtree cannot remove a
    link, and ignored the error)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g1, g2 = make_global((5, 3), "float64", seed=1), make_global((4, 2), "int32", seed=2)
    for fmt in ["npy"] + available(FORMATS):
        ext = EXT.get(fmt, "")
        target = os.path.join(shared_dir, "step-1" + ext)
        link = os.path.join(shared_dir, "latest" + ext)
        ps.save(target, {"w": ps.distribute(g1, mesh, [Shard(0)])}, format=fmt)
        on_rank0(comm, lambda t=target, lk=link: os.symlink(t, lk))
        ps.save(link, {"w": ps.distribute(g2, mesh, [Shard(0)])}, format=fmt)
        left = on_rank0(comm, lambda: [n for n in os.listdir(shared_dir) if ".old-" in n])
        assert left == [], (fmt, left)
        assert not os.path.islink(link), fmt
        for path, g in ((link, g2), (target, g1)):
            out = ps.load(path, mesh, {"w": [Shard(1)]})["w"]
            np.testing.assert_array_equal(out.local, g[out.box], err_msg=f"{fmt} {path}")
    mesh.free()
