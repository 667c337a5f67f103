"""Files from other tools, or pyshard's files changed by them, loaded into several layouts:
HDF5 datasets whose file type is not numpy's (12-bit ints, an enum h5py calls bool), user
blocks of 16 KiB and more, datasets reached by a second hard link or a soft link; one entry
pyshard cannot hold beside the ones it can (only a load that names it fails); a safetensors
tensor cast by another tool after pyshard saved it; a Zarr shard that zarr-python deleted
(it was all fill value); a lone ``numpy.save`` file given as a checkpoint.

Every loaded shard is compared with the numpy slice of the global array; every error is
checked to be the same on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile

import numpy as np
import pytest
from test_checkpoint import same_error

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.checkpoint import formats

pytestmark = pytest.mark.mpi


@pytest.fixture
def shared_dir(comm):
    """A directory made by rank 0 and shared by every rank (each rank's tmp_path differs)."""
    d = tempfile.mkdtemp(prefix="pyshard-interop-") if comm.rank == 0 else None
    d = comm.bcast(d, root=0)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def targets(comm):
    """(mesh, placements, uneven) to load into on a 1-D mesh: Shard(0), Replicate,
    Shard(1), and every row on the last rank (``uneven``)."""
    mesh = ps.Mesh(comm, (comm.size,))
    return [
        (mesh, [Shard(0)], False),
        (mesh, [Replicate()], False),
        (mesh, [Shard(1)], False),
        (mesh, [Shard(0)], True),
    ]


def check_all(comm, path, want, **kw):
    """Load every array of ``want`` (name -> global numpy array, 2-D) in every target
    layout and compare each rank's shard with the slice of the global array; the failures
    of every rank, gathered."""
    bad = []
    for mesh, pl, uneven in targets(comm):
        for name, ref in want.items():
            sz = {0: [0] * (comm.size - 1) + [ref.shape[0]]} if uneven else None
            try:
                y = ps.load(path, mesh, {name: pl}, None if sz is None else {name: sz}, **kw)
            except Exception as e:  # noqa: BLE001 - reported below, on every rank
                bad.append(f"{name} {pl}: {type(e).__name__}: {e}")
                continue
            y = y[name]
            got = np.asarray(y.local)
            exp = ref[y.layout.box(mesh.coords)]
            if got.dtype != ref.dtype or not np.array_equal(got, exp):
                bad.append(f"{name} {pl} {sz}: got {got.dtype} {got.tolist()}, want "
                           f"{ref.dtype} {exp.tolist()}")  # fmt: skip
    return [b for r in comm.allgather(bad) for b in r]


def error_of(fn, *args, **kw):
    """``"Type: message"`` of what ``fn(*args, **kw)`` raised, or ``"no error"``."""
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - compared across the ranks
        return f"{type(e).__name__}: {e}"
    return "no error"


# --------------------------------------------------------------------------- HDF5


@pytest.mark.mpi(min_size=1)
def test_h5_file_type_not_numpys(comm, shared_dir):
    """A contiguous dataset whose file type is not the one h5py writes for its numpy dtype
    (12-bit signed ints in 16 bits, a bool stored as an HDF5 enum over int32) is read
    through h5py, not as raw bytes; plain and big-endian datasets still load."""
    h5py = pytest.importorskip("h5py")
    f = os.path.join(shared_dir, "types.h5")
    rng = np.random.default_rng(3)
    n = 2 * comm.size + 1
    bo = rng.random((n, 3)) < 0.5
    p12 = rng.integers(-2048, 2048, (n, 3)).astype("i2")
    plain = rng.random((n, 3)).astype("f4")
    big = rng.random((n, 3)).astype(">f8")
    if comm.rank == 0:
        with h5py.File(f, "w") as h:
            tid = h5py.h5t.enum_create(h5py.h5t.STD_I32LE)
            tid.enum_insert(b"FALSE", 0)
            tid.enum_insert(b"TRUE", 1)
            ds = h5py.h5d.create(h.id, b"flags", tid, h5py.h5s.create_simple(bo.shape))
            ds.write(h5py.h5s.ALL, h5py.h5s.ALL, bo.astype("i4"), mtype=tid)
            t12 = h5py.h5t.STD_I16LE.copy()
            t12.set_precision(12)
            ds = h5py.h5d.create(h.id, b"adc12", t12, h5py.h5s.create_simple(p12.shape))
            ds.write(h5py.h5s.ALL, h5py.h5s.ALL, p12)
            h["plain"] = plain
            h["big"] = big
    comm.Barrier()
    want = {"flags": bo, "adc12": p12, "plain": plain, "big": big.astype("f8")}
    assert check_all(comm, f, want) == []
    _, arrays, _ = formats.open_arrays(f, "load")
    kinds = {n: arrays[n]["kind"] for n in want}
    assert kinds == {"flags": "h5py", "adc12": "h5py", "plain": "raw", "big": "h5py"}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("ub", [16384, 65536])
def test_h5_large_user_block(comm, shared_dir, ub):
    """An HDF5 file with a user block of 16 KiB or more (its signature at byte 16384 or
    65536) is found and loads."""
    h5py = pytest.importorskip("h5py")
    f = os.path.join(shared_dir, f"ub{ub}.h5")
    x = np.arange(6.0 * (comm.size + 1)).reshape(-1, 3)
    if comm.rank == 0:
        with h5py.File(f, "w", userblock_size=ub) as h:
            h["x"] = x
        with open(f, "r+b") as fh:
            fh.write(b"a user block, not HDF5")
    comm.Barrier()
    assert check_all(comm, f, {"x": x}) == []


@pytest.mark.mpi(min_size=1)
def test_h5_links(comm, shared_dir):
    """A dataset reached by a second hard link, a soft link or a group linked twice loads by
    every name; checkpoint_info lists every link's name."""
    h5py = pytest.importorskip("h5py")
    f = os.path.join(shared_dir, "links.h5")
    x = np.arange(12.0 * comm.size).reshape(-1, 3)
    if comm.rank == 0:
        with h5py.File(f, "w") as h:
            h["entry/data"] = x
            h["a_alias"] = h["entry/data"]  # a second hard link, sorted first
            h["latest"] = h5py.SoftLink("/entry/data")
            h["entry2"] = h["entry"]  # a group linked twice: entry2/data
            h["dangling"] = h5py.SoftLink("/nowhere")
    comm.Barrier()
    info = ps.checkpoint_info(f)
    assert sorted(info["arrays"]) == ["a_alias", "entry/data", "latest"]
    names = ["entry/data", "a_alias", "latest", "entry2/data"]
    assert check_all(comm, f, {n: x for n in names}) == []


# --------------------------------------------------------------------------- one bad entry


def write_unsupported(d):
    """Rank 0: files with an array ``x`` beside an entry pyshard cannot hold; {path:
    (name of the bad entry, a word of its reason)}."""
    x = np.arange(12.0).reshape(4, 3)
    out = {}
    st = os.path.join(d, "f4.safetensors")
    hdr = {"x": {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]},
           "packed": {"dtype": "F4", "shape": [2], "data_offsets": [48, 49]}}  # fmt: skip
    hb = json.dumps(hdr).encode()
    with open(st, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb + x.astype("f4").tobytes() + b"\0")
    out[st] = ("packed", "'F4'")
    try:
        import h5py
    except ImportError:
        h5py = None
    if h5py is not None:
        p = os.path.join(d, "str.h5")
        with h5py.File(p, "w") as h:
            h["x"] = x
            h["description"] = "a run of the model"
        out[p] = ("description", "dtype object")
    try:
        import zarr
    except ImportError:
        zarr = None
    if zarr is not None:
        p = os.path.join(d, "str.zarr")
        g = zarr.open_group(p, mode="w", zarr_format=3)
        g.create_array("x", shape=x.shape, dtype=x.dtype, chunks=(2, 3))[...] = x
        g.create_array("labels", shape=(2,), dtype=str)[...] = np.array(["a", "b"])
        out[p] = ("labels", "data_type")
        p = os.path.join(d, "codec.zarr")
        g = zarr.open_group(p, mode="w", zarr_format=3)
        g.create_array("x", shape=x.shape, dtype=x.dtype, chunks=(2, 3))[...] = x
        g.create_array("odd", shape=(4,), dtype="f8", chunks=(2,))[...] = 1.0
        meta = os.path.join(p, "odd", "zarr.json")
        with open(meta) as fh:
            m = json.load(fh)
        m["codecs"].append({"name": "rot13"})  # a codec pyshard does not know
        with open(meta, "w") as fh:
            json.dump(m, fh)
        out[p] = ("odd", "unknown codec 'rot13'")
    return x, out


@pytest.mark.mpi(min_size=1)
def test_one_unsupported_entry(comm, shared_dir):
    """One entry pyshard cannot hold (an HDF5 string dataset, a Zarr string array or
    unknown codec, a safetensors F4 tensor) leaves the file's other arrays loadable;
    checkpoint_info lists it under ``unsupported`` with its reason; a load naming it raises
    the same ValueError on every rank, naming the file, the entry and the reason."""
    res = None
    if comm.rank == 0:
        res = write_unsupported(shared_dir)
    x, files = comm.bcast(res, root=0)
    mesh = ps.Mesh(comm, (comm.size,))
    failures = []
    for path, (bad, why) in sorted(files.items()):
        ref = x.astype("f4") if path.endswith(".safetensors") else x
        failures += [f"{path}: {b}" for b in check_all(comm, path, {"x": ref})]
        info = ps.checkpoint_info(path)
        if sorted(info["arrays"]) != ["x"] or sorted(info["unsupported"]) != [bad]:
            failures.append(f"{path}: info {sorted(info['arrays'])} {info['unsupported']}")
        elif why not in info["unsupported"][bad]:
            failures.append(f"{path}: reason {info['unsupported'][bad]!r} lacks {why!r}")
        msg = error_of(ps.load, path, mesh, {bad: [Replicate()], "x": [Shard(0)]})
        failures += same_error(comm, msg, f"ValueError: load: {path!r}: array {bad!r} cannot")
        if why not in msg:
            failures.append(f"{path}: {msg!r} lacks {why!r}")
    assert failures == []


@pytest.mark.mpi(min_size=1)
def test_safetensors_unsupported_entry_still_checked(comm, shared_dir):
    """A tensor of an unknown dtype whose offsets overlap another's still refuses the whole
    file (the overlap makes the file untrustworthy)."""
    path = os.path.join(shared_dir, "overlap.safetensors")
    if comm.rank == 0:
        hdr = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "packed": {"dtype": "F4", "shape": [2], "data_offsets": [4, 5]}}  # fmt: skip
        hb = json.dumps(hdr).encode()
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", len(hb)) + hb + bytes(8))
    comm.Barrier()
    mesh = ps.Mesh(comm, (comm.size,))
    msg = error_of(lambda: ps.load(path, mesh, {"x": [Replicate()]}))
    assert same_error(comm, msg, f"ValueError: load: {path!r}: tensors") == []
    assert "overlap" in msg


# --------------------------------------------------------------------------- changed by tools


@pytest.mark.mpi(min_size=1)
def test_safetensors_tensor_cast_by_another_tool(comm, shared_dir, caplog):
    """pyshard's safetensors file whose tensor ``w`` another tool cast to float16 and saved
    again with the original ``__metadata__``: ``w`` loads as the file's float16 (a foreign
    tensor: no saved layout, a warning naming both dtypes), ``b`` as before."""
    path = os.path.join(shared_dir, "model.safetensors")
    n = 2 * comm.size + 1
    w = (np.arange(n * 3, dtype="f4").reshape(n, 3) / 7).astype("f4")
    b = np.arange(n, dtype="f4").reshape(n, 1) + 0.5
    mesh = ps.Mesh(comm, (comm.size,))
    src = {
        "w": ps.distribute(w, mesh, [Shard(0)]),
        "b": ps.distribute(b, mesh, [Replicate()]),
    }
    ps.save(path, src, format="safetensors")
    if comm.rank == 0:  # what load_file, a cast and save_file(metadata=...) make
        with open(path, "rb") as fh:
            (hn,) = struct.unpack("<Q", fh.read(8))
            hdr = json.loads(fh.read(hn))
            data = fh.read()
        tensors = {k: v for k, v in hdr.items() if k != "__metadata__"}
        arrays = {}
        for k, v in tensors.items():
            a, e = v["data_offsets"]
            arrays[k] = np.frombuffer(data[a:e], "<f4").reshape(v["shape"])
        arrays["w"] = arrays["w"].astype("<f2")
        new, pos = {"__metadata__": hdr["__metadata__"]}, 0
        blob = b""
        for k in sorted(arrays):
            raw = arrays[k].tobytes()
            code = "F16" if arrays[k].dtype == np.float16 else "F32"
            new[k] = {"dtype": code, "shape": list(arrays[k].shape),
                      "data_offsets": [pos, pos + len(raw)]}  # fmt: skip
            blob += raw
            pos += len(raw)
        hb = json.dumps(new).encode()
        hb += b" " * (-(8 + len(hb)) % 8)
        with open(path + ".new", "wb") as fh:
            fh.write(struct.pack("<Q", len(hb)) + hb + blob)
        os.replace(path + ".new", path)
    comm.Barrier()
    with caplog.at_level(logging.WARNING, logger="pyshard"):
        failures = check_all(comm, path, {"w": w.astype("f2"), "b": b})
        info = ps.checkpoint_info(path)
    assert failures == []
    assert info["arrays"]["w"]["dtype"] == np.float16
    assert info["arrays"]["w"]["placements"] == []  # a foreign tensor: no saved layout
    assert info["arrays"]["b"]["placements"] == ["R"]
    warned = [r.getMessage() for r in caplog.records if "'w'" in r.getMessage()]
    assert warned and "<f2" in warned[0] and "<f4" in warned[0]


@pytest.mark.mpi(min_size=1)
def test_zarr_shard_deleted_by_zarr_python(comm, shared_dir):
    """zarr-python deletes a shard whose every element it set to the fill value: a load of
    pyshard's Zarr checkpoint then raises the same FileNotFoundError on every rank, naming
    the shard and ``missing_as_fill``; with ``missing_as_fill=True`` it loads, the shard as
    the fill value."""
    zarr = pytest.importorskip("zarr")
    path = os.path.join(shared_dir, "ck.zarr")
    n = 3 * comm.size + 1
    x = np.arange(n * 3, dtype="f8").reshape(n, 3) + 1
    mesh = ps.Mesh(comm, (comm.size,))
    ps.save(path, {"x": ps.distribute(x, mesh, [Shard(0)])}, format="zarr")
    rows = None
    if comm.rank == 0:
        g = zarr.open_group(path, mode="r+")
        rows = int((g["x"].shards or g["x"].chunks)[0])
        g["x"][0:rows] = 0
    rows = comm.bcast(rows, root=0)
    want = x.copy()
    want[:rows] = 0
    msg = error_of(lambda: ps.load(path, mesh, {"x": [Shard(0)]}))
    assert same_error(comm, msg, "FileNotFoundError: load: ") == []
    assert "missing_as_fill=True" in msg and "fill value" in msg
    assert check_all(comm, path, {"x": want}, missing_as_fill=True) == []


@pytest.mark.mpi(min_size=1)
def test_lone_npy_file(comm, shared_dir):
    """A file from ``numpy.save`` given as a checkpoint: the same ValueError on every rank
    saying it is read with numpy.load (a pyshard npy checkpoint is a directory)."""
    path = os.path.join(shared_dir, "x.npy")
    if comm.rank == 0:
        np.save(path, np.arange(6.0))
    comm.Barrier()
    mesh = ps.Mesh(comm, (comm.size,))
    msg = error_of(lambda: ps.load(path, mesh, {"x": [Replicate()]}))
    assert same_error(comm, msg, f"ValueError: load: {path!r} is a single .npy file") == []
    assert "numpy.load" in msg and "directory" in msg
    msg = error_of(lambda: ps.checkpoint_info(path))
    assert "numpy.load" in msg
