"""Checkpoints of cupy arrays: saved from device arrays, loaded into host arrays and back
into device arrays (``load(..., device="cuda")``), in other layouts, against the oracle of
tests/mpi/ckpt_worker.py. Skipped without a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from ckpt_worker import expected_local, global_of, make_sharded
from gpu_helpers import DTYPES, skip_reason, to_device
from test_checkpoint import spec

import pyshard as ps

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi

MESH_2D = {1: (1, 1), 2: (2, 1), 3: (1, 3), 4: (2, 2), 6: (2, 3), 8: (2, 4)}




def check(name, y, g, device):
    """A failure message, or None when ``y`` holds ``g`` in its layout on the right side."""
    want_type = cp.ndarray if device else np.ndarray
    if not isinstance(y.local, want_type):
        return f"{name}: loaded a {type(y.local).__name__}, expected {want_type.__name__}"
    got = cp.asnumpy(y.local) if device else y.local
    want = expected_local(y.layout, y.mesh.coords, g)
    if y.dtype != g.dtype or y.global_shape != g.shape or got.dtype != g.dtype:
        return f"{name}: {y.global_shape} {y.dtype}, expected {g.shape} {g.dtype}"
    if got.shape != want.shape or not np.array_equal(got, want):
        return f"{name}: rank {y.mesh.rank} holds wrong data in {y.layout}"
    return None


def load_all(path, mesh, specs, placements, device):
    kw = {"device": "cuda"} if device else {}
    return ps.load(path, mesh, {n: placements for n in specs}, **kw)


def sources_1d(p):
    src = {}
    for i, dt in enumerate(DTYPES):
        src[f"s0-{dt}"] = spec((7, 5), dt, i, ["S(0)"])
        src[f"r-{dt}"] = spec((7, 5), dt, 20 + i, ["R"])
        src[f"p-{dt}"] = spec((7, 5), dt, 30 + i, ["P(sum)"])
    src["skew"] = spec((9, 4), "float32", 40, ["S(0)"], {0: [0] * (p - 1) + [9]})
    src["s1"] = spec((6, 11), "complex64", 41, ["S(1)"])
    src["empty"] = spec((0, 5), "float64", 0, ["S(0)"])
    return src


def test_device_save_host_and_device_load_1d(comm, transport, shared_dir):
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    src = sources_1d(p)
    arrays = {n: to_device(cp, make_sharded(mesh, s)) for n, s in src.items()}
    assert all(isinstance(x.local, cp.ndarray) for x in arrays.values())
    path = os.path.join(shared_dir, "dev")
    ps.save(path, arrays, {"from": "gpu"})
    info = ps.checkpoint_info(path)
    assert info["metadata"] == {"from": "gpu"}
    for n, s in src.items():
        assert info["arrays"][n]["dtype"] == np.dtype(s["dtype"])
        assert info["arrays"][n]["shape"] == tuple(s["shape"])
    failures = []
    loaded = {}
    for device in (False, True):
        for target in (["S(0)"], ["S(1)"], ["R"], ["P(sum)"]):
            out = load_all(path, mesh, src, target, device)
            assert sorted(out) == sorted(src)
            for n, s in src.items():
                bad = check(n, out[n], global_of(s), device)
                if bad:
                    failures.append(f"device={device} {target}: {bad}")
            if device and target == ["S(1)"]:
                loaded = out
    assert failures == []
    # device -> file -> host -> device: the arrays loaded onto the GPU save the same bytes
    path2 = os.path.join(shared_dir, "again")
    ps.save(path2, loaded)
    back = load_all(path2, mesh, src, ["S(0)"], device=False)
    dev = load_all(path2, mesh, src, ["S(0)"], device=True)
    for n, s in src.items():
        g = global_of(s)
        assert check(n, back[n], g, False) is None
        assert check(n, dev[n], g, True) is None
        assert cp.asnumpy(dev[n].local).tobytes() == back[n].local.tobytes()


@pytest.mark.parametrize("fmt", ["npy", "zarr", "hdf5", "safetensors"])
def test_device_save_load_2d(comm, transport, shared_dir, fmt):
    """Every format saves cupy shards (Zarr's writer took np.asarray of them, which cupy
    refuses: a TypeError and a temporary directory left behind)."""
    if fmt == "zarr":
        pytest.importorskip("zarr")
    if fmt == "hdf5":
        pytest.importorskip("h5py")
    a, b = MESH_2D.get(comm.size, (comm.size, 1))
    mesh = ps.Mesh(comm, (a, b))
    src = {
        "ss": spec((6, 5), "float32", 1, ["S(0)", "S(1)"]),
        "rp": spec((6, 5), "int32", 2, ["R", "P(sum)"]),
        "nested": spec((12, 3), "float16", 3, ["S(0)", "S(0)"]),
        "bool": spec((5, 6), "bool", 4, ["S(1)", "R"]),
    }
    arrays = {n: to_device(cp, make_sharded(mesh, s)) for n, s in src.items()}
    path = os.path.join(shared_dir, "dev2d" + ("" if fmt == "npy" else "." + fmt))
    ps.save(path, arrays, format=fmt)
    flat = ps.Mesh(comm, (comm.size,))
    failures = []
    for m, target in [(mesh, ["S(1)", "S(0)"]), (mesh, ["R", "R"]), (flat, ["S(0)"])]:
        for device in (True, False):
            out = load_all(path, m, src, target, device)
            for n, s in src.items():
                bad = check(n, out[n], global_of(s), device)
                if bad:
                    failures.append(f"{m.shape} {target} device={device}: {bad}")
    assert failures == []


def test_device_load_redistributes_on_the_device(comm, transport, shared_dir):
    """What load(device="cuda") returns is an ordinary device array: it redistributes on the
    GPU and its results stay cupy."""
    mesh = ps.Mesh(comm, (comm.size,))
    s = spec((10, 6), "float64", 7, ["S(0)"])
    path = os.path.join(shared_dir, "one")
    ps.save(path, {"x": make_sharded(mesh, s)})  # saved from the host
    x = ps.load(path, mesh, {"x": ["S(0)"]}, device="cuda")["x"]
    assert isinstance(x.local, cp.ndarray)
    y = x.redistribute([ps.Shard(1)])
    assert isinstance(y.local, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(y.local), global_of(s)[y.box])
