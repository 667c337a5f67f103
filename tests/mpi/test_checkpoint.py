"""Checkpoints: save in one layout, load in others, against the numpy oracle; errors; kills.

In-process tests run at the current communicator size. Tests that need other rank counts
(save on A ranks, load on B) or a killed save launch ``mpiexec`` subprocesses running
``ckpt_worker.py``; they run only when the communicator size is 1 (skipped by size).
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

import launch
import numpy as np
import pytest
from ckpt_worker import (
    check_loaded,
    global_of,
    make_sharded,
    parse_placement,
    placements_of,
    sizes_of,
)
from oracle import DTYPES as ALL_DTYPES
from oracle import agree, auto_exchange, make_global
from test_redistribute_nd import counts_since

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.checkpoint import npy_format, reading

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ckpt_worker.py")
DTYPES = ["float32", "float64", "int32", "bool"]
MESH_2D = {1: (1, 1), 2: (2, 1), 3: (1, 3), 4: (2, 2), 5: (5, 1), 6: (2, 3), 7: (7, 1), 8: (2, 4)}


@pytest.fixture
def shared_dir(comm):
    """A directory made by rank 0 and shared by every rank (each rank's tmp_path differs)."""
    d = tempfile.mkdtemp(prefix="pyshard-ckpt-") if comm.rank == 0 else None
    d = comm.bcast(d, root=0)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def spec(shape, dtype, seed, placements, sizes=None):
    s = {"shape": list(shape), "dtype": dtype, "seed": seed, "placements": placements}
    if sizes is not None:
        s["sizes"] = {str(k): list(v) for k, v in sizes.items()}
    return s


def skew(n, parts):
    """All of ``n`` on the first shard, the rest empty."""
    return [n] + [0] * (parts - 1)


def on_rank0(comm, fn):
    """Run ``fn`` on rank 0 only; every rank gets its result (or re-raises its error)."""
    res = None
    if comm.rank == 0:
        try:
            res = ("ok", fn())
        except Exception as e:  # report, then raise on every rank
            res = ("err", f"{type(e).__name__}: {e}")
    res = comm.bcast(res, root=0)
    if res[0] == "err":
        raise AssertionError(f"rank 0: {res[1]}")
    return res[1]


def load_and_check(mesh, path, specs, where):
    """Load every spec'd array in its layout; the failures on this rank."""
    placements = {n: placements_of(s) for n, s in specs.items()}
    sizes = {n: sizes_of(s) for n, s in specs.items() if s.get("sizes") is not None}
    out = ps.load(path, mesh, placements, sizes)
    assert sorted(out) == sorted(specs)
    bad = [check_loaded(n, out[n], global_of(s), where) for n, s in specs.items()]
    return [b for b in bad if b]


def npy_equal_globals(path, specs):
    """numpy.load(mmap_mode='r') of every file gives the global array (rank 0)."""
    info = ps.checkpoint_info(path)
    bad = []
    for name, s in specs.items():
        f = os.path.join(path, info["arrays"][name]["file"])
        a = np.load(f, mmap_mode="r")
        g = global_of(s)
        if a.shape != g.shape or a.dtype != g.dtype or not np.array_equal(a, g):
            bad.append(f"{f}: numpy.load gives {a.shape} {a.dtype}, not the global array")
        del a
    return bad


# ----------------------------------------------------------------------------- in process


def test_roundtrip_1d(comm, shared_dir):
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    shape = (7, 5)  # empty shards from 8 ranks on
    src = {}
    for i, dt in enumerate(DTYPES):
        src[f"s0-{dt}"] = spec(shape, dt, i, ["S(0)"])
        src[f"s1-{dt}"] = spec(shape, dt, 10 + i, ["S(1)"])
        src[f"r-{dt}"] = spec(shape, dt, 20 + i, ["R"])
        src[f"p-{dt}"] = spec(shape, dt, 30 + i, ["P(sum)"])
        src[f"skew-{dt}"] = spec(shape, dt, 40 + i, ["S(0)"], {0: skew(7, p)[::-1]})
    for dt in ("float16", "int64", "complex128"):
        src[f"s0-{dt}"] = spec(shape, dt, 50, ["S(0)"])
    src["empty-rows"] = spec((0, 5), "float32", 0, ["S(0)"])
    src["empty-cols"] = spec((4, 0), "int32", 0, ["S(1)"])
    src["scalar"] = spec((), "float64", 3, ["R"])
    src["vector"] = spec((3,), "bool", 4, ["S(0)"])
    path = os.path.join(shared_dir, "c1d")
    ps.save(path, {n: make_sharded(mesh, s) for n, s in src.items()}, {"case": "1d"})
    assert on_rank0(comm, lambda: npy_equal_globals(path, src)) == []

    targets = [["S(0)"], ["S(1)"], ["R"], ["P(sum)"], "skew1"]
    failures = []
    for t in targets:
        specs = {}
        for n, s in src.items():
            nd = len(s["shape"])
            d = dict(s)
            d.pop("sizes", None)
            if nd == 0:
                d["placements"] = ["R"]
            elif t == "skew1":
                dim = min(1, nd - 1)
                d["placements"] = [f"S({dim})"]
                d["sizes"] = {str(dim): skew(s["shape"][dim], p)}
            elif t == ["S(1)"] and nd < 2:
                d["placements"] = ["S(0)"]
            else:
                d["placements"] = t
            specs[n] = d
        failures += load_and_check(mesh, path, specs, f"target {t}: ")
    assert failures == []


def test_roundtrip_2d(comm, shared_dir):
    a, b = MESH_2D.get(comm.size, (comm.size, 1))
    mesh = ps.Mesh(comm, (a, b))
    shape = (6, 5)
    sources = [
        ["S(0)", "S(1)"],
        ["S(0)", "S(0)"],
        ["R", "S(1)"],
        ["P(sum)", "S(0)"],
        ["S(1)", "P(sum)"],
    ]
    src = {}
    for i, pl in enumerate(sources):
        for dt in ("float32", "int32", "bool"):
            src[f"{i}-{dt}"] = spec(shape, dt, 7 * i, pl)
    src["uneven"] = spec(shape, "float64", 99, ["S(1)", "S(0)"], {1: skew(5, a), 0: skew(6, b)})
    src["empty"] = spec((0, 3), "float64", 0, ["S(0)", "S(1)"])
    path = os.path.join(shared_dir, "c2d")
    ps.save(path, {n: make_sharded(mesh, s) for n, s in src.items()})
    assert on_rank0(comm, lambda: npy_equal_globals(path, src)) == []

    failures = []
    flipped = ps.Mesh(comm, (b, a))
    flat = ps.Mesh(comm, (comm.size,))
    for m, t in [
        (mesh, ["S(1)", "S(0)"]),
        (mesh, ["R", "R"]),
        (flipped, ["S(1)", "S(1)"]),
        (flipped, ["S(0)", "P(sum)"]),
        (flat, ["S(0)"]),
    ]:
        specs = {n: dict(s, placements=t) for n, s in src.items()}
        for s in specs.values():
            s.pop("sizes", None)
        failures += load_and_check(m, path, specs, f"{m.shape} {t}: ")
    assert failures == []


def many_specs(p):
    """Many small arrays saved as Shard(0) (some skewed), every dtype, uneven and empty
    shards and row blocks, with targets that need an exchange (S(1), uneven, a skewed 1-D
    rebalance, S(2)) and some that do not fuse (R, P(sum), 0-d, one over 256 KiB a rank)."""
    src, dst = {}, {}
    for k in range(40):
        dt = ALL_DTYPES[k % len(ALL_DTYPES)]
        shape = (1 + (5 * k + 2) % (3 * p + 4), 1 + (7 * k) % 11)  # fewer rows than ranks too
        sizes = {0: skew(shape[0], p)} if k % 5 == 0 else None
        src[f"m{k:02d}"] = spec(shape, dt, k, ["S(0)"], sizes)
        tsizes = {1: skew(shape[1], p)[::-1]} if k % 7 == 3 else None
        dst[f"m{k:02d}"] = spec(shape, dt, k, ["S(1)"], tsizes)
    extra = {
        "empty-rows": ((0, 5), "float32", ["S(1)"], None),
        "empty-cols": ((4, 0), "int32", ["S(1)"], None),
        "vector": ((2 * p + 1,), "int64", ["S(0)"], {0: skew(2 * p + 1, p)}),
        "cube": ((3, 4, p + 1), "complex128", ["S(2)"], None),
        "rep": ((5, 3), "float64", ["R"], None),
        "part": ((5, 3), "float32", ["P(sum)"], None),
        "scalar": ((), "float64", ["R"], None),
        "big": ((64 * p, 1100), "float32", ["S(1)"], None),  # 275 KiB a rank: not fused
    }
    for i, (n, (shape, dt, pl, tsizes)) in enumerate(extra.items()):
        src[n] = spec(shape, dt, 100 + i, ["S(0)"] if shape else ["R"])
        dst[n] = spec(shape, dt, 100 + i, pl, tsizes)
    return src, dst


def test_load_many_arrays_one_exchange(comm, shared_dir, monkeypatch):
    """A checkpoint of many small arrays loads with one fused alltoallv (comm_stats), every
    shard equal to the oracle's box, the same as the direct reads give (no core collective)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    src, dst = many_specs(p)
    path = os.path.join(shared_dir, "many")
    ps.save(path, {n: make_sharded(mesh, s) for n, s in src.items()})
    before = ps.comm_stats()
    failures = load_and_check(mesh, path, dst, "fused: ")
    got = counts_since(before)
    assert failures == []
    assert got == (auto_exchange(mesh, {"alltoallv": 1}) if p > 1 else {}), got
    monkeypatch.setenv("PYSHARD_LOAD_FUSE", "0")
    before = ps.comm_stats()
    assert load_and_check(mesh, path, dst, "direct: ") == []
    assert counts_since(before) == {}
    mesh.free()


def test_load_many_nd_mesh(comm, shared_dir):
    a, b = MESH_2D.get(comm.size, (comm.size, 1))
    mesh = ps.Mesh(comm, (a, b))
    src = {}
    for k in range(12):
        shape = (1 + (3 * k) % (2 * a + 3), 2 + (5 * k) % (3 * b + 2))
        src[f"w{k}"] = spec(shape, DTYPES[k % len(DTYPES)], k, ["S(0)", "S(1)"])
    path = os.path.join(shared_dir, "many2d")
    ps.save(path, {n: make_sharded(mesh, s) for n, s in src.items()})
    for m, t in [(mesh, ["S(1)", "S(0)"]), (ps.Mesh(comm, (b, a)), ["R", "S(1)"])]:
        specs = {n: dict(s, placements=t) for n, s in src.items()}
        # what redistribute_many fuses from row blocks (Shard(0) on every mesh dim): one
        # exchange per communicator (the whole mesh; mesh dim 0 alone for one-row arrays)
        rows = {n: ps.distribute(global_of(s), m, [Shard(0)] * 2) for n, s in src.items()}
        fused = ps.plan_many(rows, [parse_placement(x) for x in t]).fused
        before = ps.comm_stats()
        assert load_and_check(m, path, specs, f"{m.shape} {t}: ") == []
        got = counts_since(before)
        if m is mesh and a > 1:  # a transpose: it fuses (on 1x3 it is a local copy)
            assert 1 <= len(fused) <= 2, fused
        want: dict = {}
        for dims, _ in fused:  # node-shared memory where it serves that communicator
            for k, v in auto_exchange(m, {"alltoallv": 1}, dims=dims).items():
                want[k] = want.get(k, 0) + v
        assert got == want, (m.shape, t, got)


def test_load_many_read_error_on_one_rank(comm, shared_dir, monkeypatch):
    """A row-block read that fails on one rank raises the same error on every rank, before
    the exchange (no rank left waiting in it)."""
    if comm.size == 1:
        pytest.skip("one rank reads every box directly: no row blocks, no exchange")
    mesh = ps.Mesh(comm, (comm.size,))
    src = {f"w{k}": spec((3 + k, 4), "float32", k, ["S(0)"]) for k in range(4)}
    path = os.path.join(shared_dir, "bad")
    ps.save(path, {n: make_sharded(mesh, s) for n, s in src.items()})
    read_rows = reading.read_rows

    def failing(fname, *args):
        if comm.rank == comm.size - 1 and fname.endswith("w2.npy"):
            raise OSError("disk on fire")
        return read_rows(fname, *args)

    monkeypatch.setattr(reading, "read_rows", failing)
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="cannot read .*disk on fire"):
        ps.load(path, mesh, {n: ["S(1)"] for n in src})
    assert counts_since(before) == {}
    mesh.free()


def test_metadata_info_and_overwrite(comm, shared_dir):
    mesh = ps.Mesh(comm, (comm.size,))
    p = comm.size
    g = make_global((9, 4), "float32", seed=1)
    x = ps.distribute(g, mesh, [Shard(0)], sizes={0: skew(9, p)})
    part = make_sharded(mesh, spec((3, 2), "int32", 2, ["P(sum)"]))
    meta = {"step": 12, "lr": 0.5, "tags": ["a", "b"], "nested": {"k": None}}
    path = os.path.join(shared_dir, "ck")
    ps.save(path, {"w": x, "acc": part}, meta)
    info = ps.checkpoint_info(path)
    assert info["metadata"] == meta
    assert info["ranks"] == p
    assert sorted(info["arrays"]) == ["acc", "w"]
    w = info["arrays"]["w"]
    assert w["shape"] == (9, 4) and w["dtype"] == np.float32 and w["nbytes"] == g.nbytes
    assert w["mesh_shape"] == (p,) and w["placements"] == ["S(0)"]
    assert w["sizes"] == {0: tuple(skew(9, p))}
    acc = info["arrays"]["acc"]
    assert acc["placements"] == ["P(sum)"] and acc["sizes"] == {} and acc["dtype"] == np.int32
    # one writer per box: a replicated (reduced) array is one block, empty shards none
    with open(os.path.join(path, "manifest.json")) as f:
        blocks = {n: e["checksum"]["blocks"] for n, e in json.load(f)["arrays"].items()}
    assert [(b["start"], b["shape"]) for b in blocks["acc"]] == [([0, 0], [3, 2])]
    assert [(b["start"], b["shape"]) for b in blocks["w"]] == [([0, 0], [9, 4])]

    # a second save replaces the first, and leaves nothing else next to it
    g2 = make_global((2, 3), "float64", seed=5)
    ps.save(path, {"w": ps.distribute(g2, mesh, [Replicate()])}, {"step": 13})
    info = ps.checkpoint_info(path)
    assert info["metadata"] == {"step": 13} and sorted(info["arrays"]) == ["w"]
    out = ps.load(path, mesh, {"w": ["S(1)"]})
    np.testing.assert_array_equal(out["w"].local, g2[out["w"].box])
    assert on_rank0(comm, lambda: sorted(os.listdir(shared_dir))) == ["ck"]

    # str(path)-like objects work, and an empty directory may be the target
    empty = os.path.join(shared_dir, "empty")
    on_rank0(comm, lambda: os.mkdir(empty))
    import pathlib

    ps.save(pathlib.Path(empty), {"w": x})
    assert ps.checkpoint_info(empty)["arrays"]["w"]["shape"] == (9, 4)


def test_big_endian_verifies(comm, shared_dir):
    """A .npy checkpoint of big-endian arrays, 0-d ones included, loads with verify=True
    (a 0-d block was read back as a native-order scalar, and its crc32 called the file
    corrupt)."""
    mesh = ps.Mesh(comm, (comm.size,))
    gs = {
        "s": np.array(-123456, dtype=">i4"),
        "f": np.array(2.5e-3, dtype=">f8"),
        "c": (np.arange(7) * (1 + 2j)).astype(">c16"),
        "u": np.arange(12, dtype=">u2").reshape(3, 4),
    }
    xs = {n: ps.distribute(g, mesh, [Shard(0)] if g.ndim else [Replicate()]) for n, g in gs.items()}
    path = os.path.join(shared_dir, "be")
    ps.save(path, xs)
    out = ps.load(path, mesh, {n: ["R"] for n in gs}, verify=True)
    for n, g in gs.items():
        assert out[n].local.dtype == g.dtype, n
        np.testing.assert_array_equal(out[n].local, g)


def _corrupt(comm, base, path, fn):
    """Rank 0 copies ``base`` to ``path`` and applies ``fn``; every rank waits for it."""

    def work():
        shutil.copytree(base, path)
        fn(path)

    comm.Barrier()
    on_rank0(comm, work)


def test_load_errors_on_every_rank(comm, shared_dir):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 5), "float64", seed=3)
    h = make_global((4,), "int32", seed=4)
    base = os.path.join(shared_dir, "base")
    ps.save(
        base, {"x": ps.distribute(g, mesh, [Shard(0)]), "h": ps.distribute(h, mesh, [Replicate()])}
    )
    want = {"x": [Shard(1)], "h": [Shard(0)]}

    def truncate(p):
        f = os.path.join(p, "x.npy")
        os.truncate(f, os.path.getsize(f) - 8)

    def flip(p):
        f = os.path.join(p, "x.npy")
        with open(f, "r+b") as fh:
            fh.seek(-3, os.SEEK_END)
            c = fh.read(1)
            fh.seek(-3, os.SEEK_END)
            fh.write(bytes([c[0] ^ 0x40]))

    def reshape(p):
        np.save(os.path.join(p, "x.npy"), g.reshape(5, 6))

    def retype(p):
        np.save(os.path.join(p, "x.npy"), g.astype(np.int32))

    def retype_same_bytes(p):
        np.save(os.path.join(p, "x.npy"), g.view(np.int64))

    def garbage_manifest(p):
        with open(os.path.join(p, "manifest.json"), "w") as f:
            f.write("{not json")

    def garbage_npy(p):
        with open(os.path.join(p, "x.npy"), "wb") as f:
            f.write(b"garbage")

    cases = [
        (
            "nomanifest",
            lambda p: os.remove(os.path.join(p, "manifest.json")),
            FileNotFoundError,
            "manifest",
        ),
        ("nofile", lambda p: os.remove(os.path.join(p, "x.npy")), FileNotFoundError, "missing"),
        ("truncated", truncate, ValueError, "truncated"),
        ("checksum", flip, ValueError, "checksum mismatch"),
        ("shape", reshape, ValueError, r"\(5, 6\) float64"),
        ("dtype", retype, ValueError, "int32"),
        ("dtype2", retype_same_bytes, ValueError, "int64"),
        ("json", garbage_manifest, ValueError, "JSON"),
        ("npy", garbage_npy, ValueError, "not a readable .npy"),
    ]
    for name, fn, exc, match in cases:
        p = os.path.join(shared_dir, name)
        _corrupt(comm, base, p, fn)
        with pytest.raises(exc, match=match) as ei:
            ps.load(p, mesh, want)
        assert p in str(ei.value), (name, str(ei.value))
    # verify=False skips the checksums (the flipped bit then loads)
    out = ps.load(os.path.join(shared_dir, "checksum"), mesh, want, verify=False)
    assert out["x"].global_shape == (6, 5)
    # the other array of a checkpoint with one bad file still loads
    out = ps.load(os.path.join(shared_dir, "truncated"), mesh, {"h": [Replicate()]})
    np.testing.assert_array_equal(out["h"].local, h)
    with pytest.raises(FileNotFoundError, match="no checkpoint file or directory"):
        ps.load(os.path.join(shared_dir, "nowhere"), mesh, want)
    with pytest.raises(ValueError, match="no array named 'nope'"):
        ps.load(base, mesh, {"x": [Shard(0)], "nope": [Shard(0)]})
    with pytest.raises(ValueError, match="placements has 2 entries"):
        ps.load(base, mesh, {"x": [Shard(0), Shard(1)]})
    with pytest.raises(ValueError, match="not among the names"):
        ps.load(base, mesh, {"x": [Shard(0)]}, sizes={"h": {0: [4]}})
    with pytest.raises(ValueError, match="cannot parse placement"):
        ps.load(base, mesh, {"x": ["Q"]})
    with pytest.raises(FileNotFoundError, match="manifest"):
        ps.checkpoint_info(os.path.join(shared_dir, "nomanifest"))
    # ranks are still in step: a good load works
    out = ps.load(base, mesh, want)
    np.testing.assert_array_equal(out["x"].local, g[out["x"].box])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("differs", ["sizes", "placements", "name", "verify"])
def test_load_arguments_that_differ_on_one_rank(comm, shared_dir, differs):
    """One rank passes other sizes, placements, names or verify= to load, without the
    validation mode: every rank raises the same ValueError naming it (other sizes loaded
    wrong data on every rank, silently; the others hung), then a load works."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((5, 7), "float64", seed=6)
    path = os.path.join(shared_dir, "args")
    ps.save(path, {"x": ps.distribute(g, mesh, [Shard(0)]),
                   "y": ps.distribute(g, mesh, [Replicate()])})
    last = comm.size - 1
    want = {"x": [Shard(1)]}
    kw = {"sizes": {"x": {1: [7] + [0] * last}}}
    if comm.rank == last:
        if differs == "sizes":
            kw = {"sizes": {"x": {1: [0] * last + [7]}}}
        elif differs == "placements":
            want = {"x": [Replicate()]}
        elif differs == "name":
            want = {"y": [Shard(1)]}
        else:
            kw["verify"] = False  # (load's default is True)
    with pytest.raises(ValueError) as e:
        ps.load(path, mesh, want, **kw)
    msg = str(e.value)
    assert f"ranks [{last}] pass another" in msg, msg
    assert comm.allgather(msg) == [msg] * comm.size
    out = ps.load(path, mesh, {"x": [Shard(1)]}, **{"sizes": {"x": {1: [7] + [0] * last}}})
    np.testing.assert_array_equal(out["x"].local, g[out["x"].box])
    mesh.free()


def test_save_errors_on_every_rank(comm, shared_dir):
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(make_global((4, 3), "float32"), mesh, [Shard(0)])
    path = os.path.join(shared_dir, "s")
    with pytest.raises(TypeError, match="dict name -> ShardedArray"):
        ps.save(path, [x])
    with pytest.raises(TypeError, match="ShardedArray"):
        ps.save(path, {"x": x.local})
    with pytest.raises(ValueError, match="nothing to save"):
        ps.save(path, {})
    with pytest.raises(TypeError, match="JSON"):
        ps.save(path, {"x": x}, {"f": object()})
    with pytest.raises(FileNotFoundError, match="parent directory"):
        ps.save(os.path.join(shared_dir, "no", "such"), {"x": x})
    other = os.path.join(shared_dir, "other")
    on_rank0(comm, lambda: os.mkdir(other) or open(os.path.join(other, "keep"), "w").close())
    with pytest.raises(ValueError, match="refusing to replace"):
        ps.save(other, {"x": x})
    assert on_rank0(comm, lambda: os.listdir(other)) == ["keep"]
    if comm.size > 1:
        with pytest.raises(ValueError, match="every rank must pass the same"):
            ps.save(path, {"x": x}, {"rank": comm.rank})
    # no temporary directories left
    assert on_rank0(comm, lambda: sorted(os.listdir(shared_dir))) == ["other"]


@pytest.mark.parametrize("fmt", ["npy", "safetensors"])
@pytest.mark.parametrize("refusal", [PermissionError, OSError])
def test_file_system_refusals_raise_oserror(comm, shared_dir, monkeypatch, fmt, refusal):
    """The file system refusing rank 0's steps of a save (here its mkdir or its final
    rename: a read-only directory, a full disk) raises that OSError class on every rank
    (a ValueError before, which ``except OSError`` missed); the previous checkpoint stays."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((5, 2), "float64", seed=3)
    x = ps.distribute(g, mesh, [Shard(0)])
    path = os.path.join(shared_dir, "ck." + fmt if fmt != "npy" else "ck")
    ps.save(path, {"x": x}, {"n": 1}, format=fmt)

    def refuse(*a, **k):
        raise refusal(28 if refusal is OSError else 13, "refused by the test")

    monkeypatch.setattr(os, "mkdir" if fmt == "npy" else "rename", refuse)
    with pytest.raises(refusal) as e:
        ps.save(path, {"x": ps.distribute(g + 1, mesh, [Shard(0)])}, {"n": 2}, format=fmt)
    monkeypatch.undo()
    msg = str(e.value)
    assert type(e.value) is refusal and "refused by the test" in msg and path in msg, msg
    assert comm.allgather(msg) == [msg] * comm.size
    assert ps.checkpoint_info(path)["metadata"] == {"n": 1}
    out = ps.load(path, mesh, {"x": [Replicate()]})
    np.testing.assert_array_equal(out["x"].local, g)
    mesh.free()


def same_error(comm, msg, want):
    """Failures (a list) unless every rank got ``msg`` alike and it starts with ``want``."""
    failures = []
    msgs = comm.allgather(msg)
    if len(set(msgs)) != 1:
        failures.append(f"the ranks differ: {msgs}")
    if not msg.startswith(want):
        failures.append(f"expected {want!r}..., got {msg!r}")
    return failures


def save_limited(comm, rank, limit, save):
    """Run ``save()`` on every rank with files limited to ``limit`` bytes on ``rank`` (a write
    past it fails there with EFBIG, SIGXFSZ ignored): what it raised (``"Type: text"``), or
    ``"saved"``."""
    if comm.rank == rank:
        old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        save()
        return "saved"
    except Exception as e:  # noqa: BLE001 - compared across the ranks by the caller
        return f"{type(e).__name__}: {e}"
    finally:
        if comm.rank == rank:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, old_sig)


@pytest.mark.mpi(min_size=2)
def test_npy_write_error_on_one_rank(comm, shared_dir):
    """A data write that fails on one rank (a file size limit: EFBIG) raises the same
    ValueError on every rank, none left waiting (the failed rank still takes part in the
    next array's collective write), and the previous checkpoint stays loadable. Whether the
    MPI library's own collective I/O completes after a write error on one rank is the
    library's: MPICH's does (this test); Open MPI 5.0.11's OMPIO and Intel MPI 2021.18.1 (at
    2 ranks) left the ranks in different collectives, so it runs on MPICH only
    (docs/checkpoints.md)."""
    if not ps.build_info()["mpi"].startswith("MPICH"):
        pytest.skip("collective I/O after a write error on one rank: MPICH only "
                    "(docs/checkpoints.md)")
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((128, 128), "float32", seed=4)
    arrays = {n: ps.distribute(g, mesh, [Shard(0)]) for n in ("a", "b")}
    path = os.path.join(shared_dir, "fsz")
    ps.save(path, arrays, {"v": 1})
    comm.Barrier()
    last = comm.size - 1
    # its rows start past 16 KiB of each 64 KiB file
    msg = save_limited(comm, last, 16384, lambda: ps.save(path, arrays, {"v": 2}))
    failures = same_error(comm, msg, f"ValueError: save({path!r}): array 'a': rank {last}: ")
    info = ps.checkpoint_info(path)
    if info["metadata"] != {"v": 1}:
        failures.append(f"the previous checkpoint was replaced: {info['metadata']}")
    out = ps.load(path, mesh, {"a": [Replicate()], "b": [Shard(1)]})
    for n, y in out.items():
        if not np.array_equal(y.local, g[y.box]):
            failures.append(f"array {n!r} of the previous checkpoint differs")
    left = on_rank0(comm, lambda: glob.glob(path + ".tmp-*"))
    if left:
        failures.append(f"temporary directories left: {left}")
    agree(comm, failures)


@pytest.mark.mpi(min_size=2)
def test_npy_error_before_the_write_on_one_rank(comm, shared_dir, monkeypatch):
    """A rank whose shard cannot be made ready for the write (its copy to host memory fails,
    here a MemoryError, before any MPI-IO call) still takes part in that array's collective
    open and write with an empty box: every rank raises the same ValueError naming it, none
    waits in a collective the others left, and the previous checkpoint stays. Before, the
    rank skipped the first array's collective write and the others hung in it."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((64, 8), "float64", seed=6)
    arrays = {n: ps.distribute(g, mesh, [Shard(0)]) for n in ("a", "b")}
    path = os.path.join(shared_dir, "host")
    ps.save(path, arrays, {"v": 1})
    last = comm.size - 1
    if comm.rank == last:
        def failing(a):
            raise MemoryError("no host memory for the shard")

        monkeypatch.setattr(npy_format.bk, "to_host", failing)
    try:
        ps.save(path, arrays, {"v": 2})
        msg = "saved"
    except Exception as e:  # noqa: BLE001 - compared across the ranks below
        msg = f"{type(e).__name__}: {e}"
    monkeypatch.undo()
    failures = same_error(
        comm, msg, f"ValueError: save({path!r}): array 'a': rank {last}: MemoryError("
    )
    if ps.checkpoint_info(path)["metadata"] != {"v": 1}:
        failures.append("the previous checkpoint was replaced")
    out = ps.load(path, mesh, {"a": [Replicate()], "b": [Shard(0)]})
    for n, y in out.items():
        if not np.array_equal(y.local, g[y.box]):
            failures.append(f"array {n!r} of the previous checkpoint differs")
    agree(comm, failures)


@pytest.mark.mpi(min_size=2)
def test_verify_and_sync_must_agree(comm, shared_dir):
    """``verify`` differing between ranks raises the same ValueError on every rank in the
    validation mode (a rank verifying alone would wait in its allgather); ``sync``
    differing raises in every save (MPI_File_sync is collective), in both modes."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 4), "float64", seed=5)
    x = ps.distribute(g, mesh, [Shard(0)])
    path = os.path.join(shared_dir, "mis")
    ps.save(path, {"x": x, "y": x})
    with ps.config.override(PYSHARD_VALIDATE=True):
        with pytest.raises(ValueError, match="verify: rank 0: True"):
            ps.load(path, mesh, {"x": ["S(1)"]}, verify=comm.rank == 0)
        with pytest.raises(ValueError, match="sync: rank 0: True"):
            ps.save(path, {"x": x}, sync=comm.rank == 0)
    with pytest.raises(ValueError, match="or sync than rank 0; every rank must pass the same"):
        ps.save(path, {"x": x}, sync=comm.rank == 0)
    assert sorted(ps.checkpoint_info(path)["arrays"]) == ["x", "y"]
    out = ps.load(path, mesh, {"x": ["S(1)"]}, verify=True)
    np.testing.assert_array_equal(out["x"].local, g[out["x"].box])


def test_names_become_safe_file_names(comm, shared_dir):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3, 2), "int32", seed=2)
    x = ps.distribute(g, mesh, [Shard(0)])
    names = ["a/b", "a_b", "A_B", "../up", "manifest", "ünï"]
    path = os.path.join(shared_dir, "n")
    ps.save(path, dict.fromkeys(names, x))
    info = ps.checkpoint_info(path)
    files = [info["arrays"][n]["file"] for n in names]
    assert len({f.lower() for f in files}) == len(files)
    assert all(os.path.basename(f) == f and not f.startswith(".") for f in files)
    out = ps.load(path, mesh, dict.fromkeys(names, [Replicate()]))
    for n in names:
        np.testing.assert_array_equal(out[n].local, g)


def test_partial_reduced_once(comm, shared_dir):
    """A Partial(max) source is reduced before writing; loads see the reduction."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((5, 3), "int32", seed=9)
    local = g - (comm.rank if comm.rank else 0)  # the max over ranks is g (rank 0 holds it)
    x = ps.from_local(np.ascontiguousarray(local), mesh, [Partial("max")], global_shape=g.shape)
    path = os.path.join(shared_dir, "pmax")
    ps.save(path, {"x": x})
    out = ps.load(path, mesh, {"x": [Partial("max")]})
    np.testing.assert_array_equal(out["x"].local, g)  # max/min/avg keep the value everywhere
    assert ps.checkpoint_info(path)["arrays"]["x"]["placements"] == ["P(max)"]


# ----------------------------------------------------------------------------- subprocesses


def mpirun(n, jobs, env=None, expect_ok=True):
    """Run the worker on ``n`` ranks (tests/mpi/launch.py); the completed process."""
    extra = dict(env or {})
    extra.setdefault("CKPT_FAULT", "")
    try:
        r = launch.run(n, [sys.executable, WORKER, json.dumps(jobs)], env=extra, cwd=HERE)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n {n} timed out after 120 s: {e.stdout} {e.stderr}")
    if expect_ok:
        assert r.returncode == 0 and "OK" in r.stdout, (
            f"mpiexec -n {n} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        )
    return r


def needs_subprocess(comm):
    launch.require(comm)


def _arrays(shape, placements, sizes=None, seed=0, empty_shape=(0, 5)):
    out = {dt: spec(shape, dt, seed + i, placements, sizes) for i, dt in enumerate(DTYPES)}
    out["empty"] = spec(empty_shape, "float32", 0, placements)
    return out


def _relayout(arrays, placements, sizes=None):
    out = {}
    for n, s in arrays.items():
        d = dict(s, placements=placements)
        d.pop("sizes", None)
        if sizes is not None and n != "empty":
            d["sizes"] = {str(k): list(v) for k, v in sizes.items()}
        out[n] = d
    return out


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_cross_sizes(comm, shared_dir):
    """Save on A ranks, load on B: 4 -> 3, 2x2 -> 3, 7 -> 1, 1 -> 2x3."""
    needs_subprocess(comm)
    d = shared_dir
    skewed = _arrays((101, 6), ["S(0)"], {0: [98, 1, 1, 1]}, seed=1)
    grid = _arrays((9, 7), ["S(0)", "S(1)"], seed=2)
    seven = _arrays((5, 9), ["S(0)"], seed=3)
    one = _arrays((6, 5), ["R"], seed=4)
    job = lambda op, name, mesh, arrays: {  # noqa: E731
        "op": op,
        "path": os.path.join(d, name),
        "mesh": mesh,
        "arrays": arrays,
    }
    mpirun(4, [job("save", "skew", [4], skewed), job("save", "grid", [2, 2], grid)])
    mpirun(7, [job("save", "seven", [7], seven)])
    mesh1 = ps.Mesh(comm, (1,))
    ps.save(os.path.join(d, "one"), {n: make_sharded(mesh1, s) for n, s in one.items()})
    assert load_and_check(mesh1, os.path.join(d, "seven"), _relayout(seven, ["S(1)"]), "7->1") == []
    # (one launch a rank count: each costs 2-5 s of the MPI matrix's 1-rank runs)
    mpirun(3, [job("load", "skew", [3], _relayout(skewed, ["S(1)"])),
               job("load", "grid", [3], _relayout(grid, ["R"]))])
    mpirun(6, [job("load", "one", [2, 3], _relayout(one, ["S(1)", "S(0)"]))])
    info = ps.checkpoint_info(os.path.join(d, "skew"))
    assert info["ranks"] == 4 and info["arrays"]["float64"]["sizes"] == {0: (98, 1, 1, 1)}
    assert ps.checkpoint_info(os.path.join(d, "grid"))["arrays"]["bool"]["mesh_shape"] == (2, 2)


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_killed_save_keeps_previous(comm, shared_dir):
    """A save killed before its manifest, or before its rename, leaves the old checkpoint."""
    needs_subprocess(comm)
    path = os.path.join(shared_dir, "ck")
    mesh1 = ps.Mesh(comm, (1,))
    old = spec((10, 3), "float64", 1, ["S(0)"])
    ps.save(path, {"x": make_sharded(mesh1, old)}, {"gen": 1})
    new = {"x": spec((10, 3), "float64", 2, ["S(0)"]), "y": spec((4,), "int32", 3, ["R"])}
    job = {"op": "save", "path": path, "mesh": [2], "arrays": new, "metadata": {"gen": 2}}
    for fault in ("save-after-data:1", "save-before-rename:0"):
        r = mpirun(2, [job], env={"CKPT_FAULT": fault}, expect_ok=False)
        assert r.returncode != 0, f"{fault}: the save should have died\n{r.stdout}\n{r.stderr}"
        assert os.path.isfile(os.path.join(path, "manifest.json"))
        info = ps.checkpoint_info(path)
        assert info["metadata"] == {"gen": 1} and sorted(info["arrays"]) == ["x"]
        assert load_and_check(mesh1, path, {"x": dict(old, placements=["R"])}, fault) == []
        leftovers = glob.glob(path + ".tmp-*")
        assert leftovers, "a killed save leaves its temporary directory"
        for t in leftovers:
            shutil.rmtree(t)
    # the only unprotected window: rank 0 dies between its two renames; load says where
    r = mpirun(2, [job], env={"CKPT_FAULT": "save-mid-rename:0"}, expect_ok=False)
    assert r.returncode != 0
    with pytest.raises(FileNotFoundError, match=r"\.old-"):
        ps.load(path, mesh1, {"x": [Replicate()]})
    # a save that completes replaces it
    mpirun(2, [job])
    assert ps.checkpoint_info(path)["metadata"] == {"gen": 2}
    assert load_and_check(mesh1, path, _relayout(new, ["R"]), "after") == []
