"""checkpoint_info on a checkpoint written in-process on one rank (a mesh over COMM_SELF)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.bench import bench_checkpoint


@pytest.fixture
def mesh():
    return ps.Mesh(MPI.COMM_SELF, (1,))


@pytest.fixture
def ckpt(tmp_path, mesh):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.array([True, False, True])
    path = tmp_path / "ck"
    ps.save(
        path,
        {
            "a": ps.distribute(a, mesh, [Shard(1)]),
            "b": ps.distribute(b, mesh, [Partial("max")]),
            "e": ps.distribute(np.zeros((0, 2), np.int32), mesh, [Replicate()]),
        },
        {"epoch": 7, "name": "run-1"},
    )
    return path, a, b


def test_checkpoint_info(ckpt):
    path, a, b = ckpt
    info = ps.checkpoint_info(path)
    assert info["path"] == str(path)
    assert info["version"] == 1 and info["ranks"] == 1
    assert info["metadata"] == {"epoch": 7, "name": "run-1"}
    assert sorted(info["arrays"]) == ["a", "b", "e"]
    ia, ib, ie = (info["arrays"][n] for n in "abe")
    assert ia["shape"] == (4, 3) and ia["dtype"] == np.float32 and ia["nbytes"] == a.nbytes
    assert ia["mesh_shape"] == (1,) and ia["placements"] == ["S(1)"] and ia["sizes"] == {1: (3,)}
    assert ib["shape"] == (3,) and ib["dtype"] == np.bool_ and ib["placements"] == ["P(max)"]
    assert ie["shape"] == (0, 2) and ie["dtype"] == np.int32 and ie["nbytes"] == 0
    assert ie["placements"] == ["R"] and ie["sizes"] == {}
    # the files are plain .npy
    np.testing.assert_array_equal(np.load(path / ia["file"], mmap_mode="r"), a)
    np.testing.assert_array_equal(np.load(path / ib["file"]), b)
    assert np.load(path / ie["file"]).shape == (0, 2)
    with open(path / "manifest.json") as f:
        assert json.load(f)["format"] == "pyshard-checkpoint"


def test_checkpoint_info_needs_no_communicator(ckpt, monkeypatch):
    """Pure file reading: it works with the MPI module taken away."""
    path, _, _ = ckpt

    class NoMPI:
        def __getattr__(self, name):
            raise AssertionError(f"checkpoint_info used MPI.{name}")

    for name, mod in list(sys.modules.items()):  # every module of the checkpoint package
        if name.startswith("pyshard.checkpoint") and hasattr(mod, "MPI"):
            monkeypatch.setattr(mod, "MPI", NoMPI())
    assert ps.checkpoint_info(str(path))["arrays"]["a"]["shape"] == (4, 3)


def test_load_round_trip(ckpt, mesh):
    path, a, b = ckpt
    out = ps.load(path, mesh, {"a": ["S(0)"], "b": [Replicate()], "e": [Shard(1)]})
    np.testing.assert_array_equal(out["a"].local, a)
    np.testing.assert_array_equal(out["b"].local, b)
    assert out["e"].local.shape == (0, 2)


def test_missing_manifest(ckpt, tmp_path):
    path, _, _ = ckpt
    os.remove(path / "manifest.json")
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json") as ei:
        ps.checkpoint_info(path)
    assert str(path) in str(ei.value)
    with pytest.raises(FileNotFoundError, match="no checkpoint file or directory"):
        ps.checkpoint_info(tmp_path / "nowhere")
    # a missing file of a one-file format is no missing "directory"
    with pytest.raises(FileNotFoundError, match="no checkpoint file or directory at .*x.h5"):
        ps.checkpoint_info(tmp_path / "x.h5")


def test_bad_manifest(ckpt):
    path, _, _ = ckpt
    m = json.loads((path / "manifest.json").read_text())
    m["version"] = 99
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="format version 99"):
        ps.checkpoint_info(path)
    (path / "manifest.json").write_text("[]")
    with pytest.raises(ValueError, match="not a pyshard checkpoint manifest"):
        ps.checkpoint_info(path)


def test_bench_checkpoint_small(mesh, tmp_path):
    r = bench_checkpoint(mesh, nbytes=1 << 16, path=tmp_path, reps=1, sync=False)
    assert r["case"] == "checkpoint" and r["bytes"] == 1 << 16 and r["ranks"] == 1 and r["ok"]
    for k in ("save", "load", "numpy_save", "numpy_load"):
        assert r[f"{k}_s"] > 0 and r[f"{k}_GBps"] > 0
    assert os.listdir(tmp_path) == []  # its files are gone


def test_bench_formats_small(mesh, tmp_path):
    """bench_formats on one rank: pyshard npy and hdf5 and gather + h5py measured and
    checked, h5py's mpio driver skipped with its reason where h5py has no MPI."""
    pytest.importorskip("h5py")
    from pyshard.bench import bench_formats

    rows = bench_formats(mesh, nbytes=1 << 16, formats=["npy", "hdf5"], path=tmp_path)
    by = {r["method"]: r for r in rows}
    assert list(by) == ["pyshard npy", "pyshard hdf5", "gather+h5py", "h5py mpio"]
    for m in ("pyshard npy", "pyshard hdf5", "gather+h5py"):
        assert by[m]["ok"] and by[m]["save_GBps"] > 0 and by[m]["load_GBps"] > 0, by[m]
    assert "save_s" in by["h5py mpio"] or "without MPI" in by["h5py mpio"]["skipped"]
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="unknown"):
        bench_formats(mesh, nbytes=1 << 16, formats=["npz"])


@pytest.mark.parametrize(
    "shape, grid, mesh_shape",
    [((13, 7), (4, 3), (3,)), ((9, 5, 3), (2, 2, 3), (2, 2)), ((7, 40), (7, 6), (4,)),
     ((3, 2), (5, 5), (7,)), ((0, 4), (1, 4), (2,))],
)
def test_blocks_source_reads_each_chunk_once(shape, grid, mesh_shape):
    """The plan of a chunked read: every stored chunk lies in exactly one rank's box."""
    import itertools

    from pyshard.checkpoint.reader import blocks_source

    lay = ps.Layout(shape, np.float32, mesh_shape, [Replicate()] * len(mesh_shape))
    src, d = blocks_source(lay, grid)
    boxes = [src.box(c) for c in itertools.product(*[range(m) for m in mesh_shape])]
    assert sum(int(np.prod([b.stop - b.start for b in box])) for box in boxes) == int(
        np.prod(shape)
    )
    for cidx in itertools.product(*[range(-(-n // g)) for n, g in zip(shape, grid)]):
        lo = [i * g for i, g in zip(cidx, grid)]
        hi = [min((i + 1) * g, n) for i, g, n in zip(cidx, grid, shape)]
        owners = [
            k for k, box in enumerate(boxes)
            if all(b.start < h and a < b.stop for b, a, h in zip(box, lo, hi))
        ]
        assert len(owners) == 1, (cidx, owners)
        box = boxes[owners[0]]
        assert all(b.start <= a and h <= b.stop for b, a, h in zip(box, lo, hi))


def test_a_saved_layout_that_does_not_fit_the_file_is_dropped(caplog):
    """pyshard's record kept beside another format's data: a shard table that no longer sums
    to the file's extent (resized by another tool), or that names a dim the array lacks, is
    no saved layout, with a warning saying which."""
    from pyshard.checkpoint.record import layout_of

    rec = {"arrays": {"x": {"mesh_shape": [2], "placements": ["S(0)"],
                            "sizes": {"0": [5, 5]}}}}
    assert layout_of(rec, "x", (10, 4), "w")["sizes"] == {0: (5, 5)}
    with caplog.at_level("WARNING", logger="pyshard"):
        assert layout_of(rec, "x", (12, 4), "w")["placements"] == []
        rec["arrays"]["x"]["sizes"] = {"5": [5, 5]}
        assert layout_of(rec, "x", (10, 4), "w")["sizes"] == {}
    said = [r.getMessage() for r in caplog.records]
    assert "shard table of 10 along dim 0 (resized by another tool" in said[0], said
    assert "names dim 5 of a 2-D array" in said[1], said


def test_a_saved_layout_of_an_array_recast_or_reshaped_is_dropped(caplog):
    """The record's dtype and shape (saves since they were recorded) against the file's: a
    recast or a resize along a dim the shard table does not cover drops the saved layout
    with a warning; a change of byte order alone keeps it."""
    from pyshard.checkpoint.record import layout_of

    rec = {"arrays": {"x": {"dtype": "<f8", "shape": [10, 4], "mesh_shape": [2],
                            "placements": ["R"], "sizes": {}}}}
    assert layout_of(rec, "x", (10, 4), "w", np.dtype("<f8"))["placements"] == ["R"]
    assert layout_of(rec, "x", (10, 4), "w", np.dtype(">f8"))["placements"] == ["R"]
    with caplog.at_level("WARNING", logger="pyshard"):
        assert layout_of(rec, "x", (10, 4), "w", np.dtype("<f4"))["placements"] == []
        assert layout_of(rec, "x", (10, 6), "w", np.dtype("<f8"))["placements"] == []
    said = [r.getMessage() for r in caplog.records]
    assert "is float32" not in said[0] and "is <f4 in the file" in said[0], said
    assert "says <f8 (recast by another tool" in said[0], said
    assert "is (10, 6) in the file" in said[1] and "says (10, 4) (resized" in said[1], said
    del rec["arrays"]["x"]["shape"]  # a record from before shapes were kept: no check
    assert layout_of(rec, "x", (10, 6), "w", np.dtype("<f8"))["placements"] == ["R"]
