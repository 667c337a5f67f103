"""The core's block geometry, index math and workspace pool, and the array-protocol and
build-info entry points; serial, no communication."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import pyshard as ps
from pyshard import Replicate, Shard, _core
from pyshard.geometry import geometry
from pyshard.planner import plan

RNG = np.random.default_rng(20261130)


def _random_box(shape):
    start = [int(RNG.integers(0, s + 1)) for s in shape]
    ext = [int(RNG.integers(0, s - a + 1)) for s, a in zip(shape, start)]
    return start, ext


@pytest.mark.parametrize("offsets", [False, True], ids=["odometer", "run_offsets"])
@pytest.mark.parametrize("ndim", [1, 2, 3, 5, 8])
def test_copy_box_random(ndim, offsets):
    """Random boxes between random arrays, through the host odometer and through
    run_offsets (the CUDA kernels' index math, runs split at 64 bytes), against numpy; 8-D
    boxes exceed the descriptor's 6 looped dims and are split."""
    for dtype in (np.int8, np.float32, np.complex128):
        for _ in range(25):
            sshape = [int(RNG.integers(1, 5)) for _ in range(ndim)]
            dshape = [s + int(RNG.integers(0, 3)) for s in sshape]
            start, ext = _random_box(sshape)
            dstart = [int(RNG.integers(0, d - e + 1)) for d, e in zip(dshape, ext)]
            a = (np.arange(np.prod(sshape)) % 251).astype(dtype).reshape(sshape)
            out = np.zeros(dshape, dtype)
            _core.copy_box(a, start, out, dstart, ext, offsets)
            ref = np.zeros(dshape, dtype)
            ref[tuple(slice(d, d + e) for d, e in zip(dstart, ext))] = a[
                tuple(slice(s, s + e) for s, e in zip(start, ext))
            ]
            np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("n", [0, 7, 255, 256, 4097, 100_003])
@pytest.mark.parametrize("shift", [0, 1, 9])
def test_stream_copy(n, shift):
    """The benches' floor copy (streaming stores past 256 B): every byte, from and to
    addresses off a 16-byte boundary; different sizes raise ValueError."""
    rng = np.random.default_rng(n + shift)
    src = rng.integers(0, 256, n + shift, dtype=np.uint8)[shift:]
    dst = np.zeros(n + 2 * shift + 1, np.uint8)
    _core.stream_copy(src, dst[2 * shift : 2 * shift + n])
    assert np.array_equal(dst[2 * shift : 2 * shift + n], src)
    assert not dst[: 2 * shift].any() and dst[2 * shift + n] == 0  # nothing past the ends
    with pytest.raises(ValueError, match="sizes differ"):
        _core.stream_copy(src, np.empty(n + 1, np.uint8))


def test_descriptors_merge_dims():
    """A box whose dims line up becomes a few long runs, not one run per row."""
    # every row of a (4, 6, 8) block moved whole: one descriptor, one run
    g = _core.ExchangeGeometry(2, 4, [4, 6, 8], [4, 6, 8], [(1, [0, 0, 0], [4, 6, 8])], [], [])
    assert g.descriptors == 1
    # half of the last dim of a 3-D array: dims 0 and 1 merge into one looped dim
    g = _core.ExchangeGeometry(2, 4, [4, 6, 8], [4, 6, 8], [(1, [0, 0, 4], [4, 6, 4])], [], [])
    assert g.descriptors == 1 and g.packs


def test_exchange_geometry_workspace_rule():
    """Packed blocks start 4 KiB aligned; contiguous blocks need no workspace."""
    item = 4
    # one contiguous send, one non-contiguous send (column block) at 3 ranks
    sends = [(1, [0, 0], [10, 100]), (2, [10, 0], [10, 50])]
    g = _core.ExchangeGeometry(3, item, [20, 100], [20, 100], sends, [], [])
    assert g.packs and not g.unpacks
    assert g.workspace_bytes == 4096 + 4096  # 4000 and 2000 bytes, each 4 KiB aligned
    g = _core.ExchangeGeometry(3, item, [20, 100], [20, 100], sends[:1], [], [])
    assert not g.packs and g.workspace_bytes == 0
    pad = _core.ExchangeGeometry(
        3, item, [20, 100], [20, 100], sends, [], [], _core.Algorithm.alltoall, 4000
    )
    assert pad.workspace_bytes == 2 * 3 * 4000
    with pytest.raises(ValueError, match="padding"):
        _core.ExchangeGeometry(
            3, item, [20, 100], [20, 100], sends, [], [], _core.Algorithm.alltoall, 100
        )


def test_misaligned_large_block_is_staged():
    """A contiguous block of >= 1 MiB at an offset that is not a multiple of 64 bytes goes
    through the aligned workspace (MPICH moves it faster)."""
    rows, cols = 1 + (1 << 20) // 4, 1
    sends = [(1, [1, 0], [rows, cols])]  # offset 4 bytes
    g = _core.ExchangeGeometry(2, 4, [rows + 1, cols], [rows + 1, cols], sends, [], [])
    assert g.packs


def test_explain_workspace_is_the_core_rule():
    """plan.geometry() gives the same geometry the executor builds: the 2-D swap at 2x2."""
    src = ps.Layout((9, 7), "float64", (2, 2), [Shard(0), Shard(1)])
    dst = ps.Layout((9, 7), "float64", (2, 2), [Shard(1), Shard(0)])
    p = plan(src, dst)
    for coords in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        g = geometry(p.steps[0], coords)
        assert g.workspace_bytes == p.peak_extra_bytes(coords) - 8 * np.prod(
            dst.local_shape(coords)
        )


def test_workspace_pool_trim():
    ws = _core.Workspace()
    assert ws.held == 0
    ws.trim(0)
    ws.release()
    assert ws.held == 0


def test_a_node_control_segment_asked_to_fail_names_its_argument():
    """NodeCtl's ``fail`` arguments (its setup, its connect) fail it, and why() names them."""
    import os

    bad = _core.NodeCtl(2, fail=True)
    assert not bad.ok and bad.why == "this rank's NodeCtl was made with fail=True"
    ctl = _core.NodeCtl(2)
    if not ctl.ok:
        pytest.skip(f"node-shared memory is not usable here: {ctl.why}")
    assert not ctl.connect(0, [0], [os.getpid()], [ctl.fd], fail=True)
    assert ctl.why == "this rank's NodeCtl.connect was called with fail=True"
    ctl.release()


def test_peer_attach_follows_yamas_scope(tmp_path):
    """Where Yama's ptrace_scope file is missing or says 0 nothing is done (0); anything else
    asks the kernel to let any process of this user attach (prctl PR_SET_PTRACER_ANY): 1
    where it did, -EINVAL on a kernel without Yama (this one's answer is either)."""
    assert _core.allow_peer_attach(str(tmp_path / "none")) == 0
    scope = tmp_path / "ptrace_scope"
    scope.write_text("0\n")
    assert _core.allow_peer_attach(str(scope)) == 0
    scope.write_text("1\n")
    got = _core.allow_peer_attach(str(scope))
    yama = os.path.exists("/proc/sys/kernel/yama/ptrace_scope")
    assert got == 1 if yama else got < 0, got


def test_count_limit_bounds():
    """The core's count limit takes [8, 2^31-1] (PYSHARD_COUNT_LIMIT checks the same)."""
    with pytest.raises(ValueError, match="count limit"):
        _core.set_count_limit(7)
    with pytest.raises(ValueError, match="count limit"):
        _core.set_count_limit(2**31)
    assert _core.count_limit() == ps.build_info()["count_limit"]


def test_enums_cross_the_boundary():
    assert _core.Algorithm.p2p.name == "p2p"
    assert {a.name for a in _core.Algorithm.__members__.values()} == {
        "alltoallv", "alltoall", "p2p", "alltoallw",
    }
    assert ps.StepKind.alltoallv == "alltoallv"
    p = plan(
        ps.Layout((8,), "int32", (2,), [Shard(0)]), ps.Layout((8,), "int32", (2,), [Replicate()])
    )
    assert p.steps[0].kind is ps.StepKind.allgatherv


def test_cache_limit_setter():
    old = ps.cache_limit()
    try:
        ps.set_cache_limit(3)
        lays = [ps.Layout((n, 4), "float32", (1,), [Shard(0)]) for n in range(1, 9)]
        for a in lays:
            plan(a, ps.Layout(a.shape, a.dtype, (1,), [Shard(1)]))
        assert len(plan.cache) <= 3
        with pytest.raises(ValueError, match="integer >= 1"):
            ps.set_cache_limit(0)
    finally:
        ps.config.reset("PYSHARD_CACHE_LIMIT")
        assert ps.cache_limit() == old
    ps.clear_caches()
    assert len(plan.cache) == 0


def test_build_info_and_cuda_available():
    info = ps.build_info()
    assert info["version"] == ps.__version__
    assert info["mpi"] == _core.built_with
    assert set(info["transport"]) == {"host", "cuda"}
    assert info["transport"]["host"] in ("direct", "staged")
    assert info["cuda"] is None or info["cuda"].count(".") == 1
    assert isinstance(ps.cuda_available(), bool)
    if not info["cuda_device"]:
        assert ps.cuda_available() is False


TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


@pytest.mark.parametrize("preload,want", [("", "glibc"), (TCMALLOC, "tcmalloc")])
def test_build_info_names_the_malloc(preload, want):
    """build_info()["malloc"] names the allocator a process runs with: glibc's without a
    preload, tcmalloc's under LD_PRELOAD (where the library is installed)."""
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system")
    if preload and not os.path.exists(preload):
        pytest.skip(f"{preload} is not installed (Debian: libtcmalloc-minimal4)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    code = "import pyshard._backend as b; print(b.malloc_name())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == want
    assert ps.build_info()["malloc"] in ("glibc", "tcmalloc", "jemalloc", "other")


class _DLPackProducer:
    """A host array producer that is not numpy: only the DLPack protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_producer_is_viewed_without_copy(comm):
    mesh = ps.Mesh(comm.Split(comm.rank, 0), (1,))
    g = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = ps.distribute(_DLPackProducer(g), mesh, [Shard(0)])
    np.testing.assert_array_equal(x.local, g)
    y = ps.from_local(_DLPackProducer(g), mesh, [Shard(1)], global_shape=(4, 6))
    assert np.shares_memory(y.local, g)  # zero-copy view
    np.testing.assert_array_equal(y.redistribute([Replicate()]).local, g)
    mesh.free()


def test_numpy_scalar_distribute(comm):
    mesh = ps.Mesh(comm.Split(comm.rank, 0), (1,))
    x = ps.distribute(np.float64(3.0), mesh, [Replicate()])
    assert x.local.shape == () and x.local == 3.0
    mesh.free()


def test_unsupported_input_names_the_argument(comm):
    mesh = ps.Mesh(comm.Split(comm.rank, 0), (1,))
    with pytest.raises(TypeError, match="global_array must be a numpy array, a cupy array"):
        ps.distribute([1, 2, 3], mesh, [Shard(0)])
    mesh.free()


def test_mesh_names_take_a_string_as_one_name(comm):
    """names: a plain string is the one name of a 1-D mesh (never its characters, as shape
    takes an int for one extent); for a mesh of more dims it raises, naming the argument."""
    one = comm.Split(comm.rank, 0)
    mesh = ps.Mesh(one, (1,), names="dp")
    assert mesh.names == ("dp",) and mesh.sub("dp").Get_size() == 1
    mesh.free()
    mesh = ps.Mesh(one, 1, names="d")
    assert mesh.names == ("d",)
    mesh.free()
    for shape, names in (((1, 1), "dp"), ((1, 1), "ab"), ((1, 1, 1), "dp")):
        with pytest.raises(ValueError, match=r"Mesh\(names\): need \d distinct strings, got the "
                                             r"single string"):
            ps.Mesh(one, shape, names=names)
    mesh = ps.Mesh(one, (1, 1), names=["dp", "tp"])  # any sequence of strings, as before
    assert mesh.names == ("dp", "tp")
    mesh.free()
    with pytest.raises(ValueError, match=r"Mesh\(names\): need 2 distinct strings"):
        ps.Mesh(one, (1, 1), names=("dp", "dp"))
    one.Free()


def test_sparse_swap_at_65536_ranks_touches_one_peer():
    """Simulated: one rank of the 2-D swap on a 256 x 256 mesh finds its one peer and builds
    a point-to-point geometry of one block each way; explain() says so (the bench case
    `sparse` times the same setup at 256, 4096 and 65,536 ranks)."""
    from pyshard.bench import bench_sparse_setup

    r = bench_sparse_setup(sides=(16, 256), n=4096)
    for row in r["rows"]:
        assert row["max_peers"] == 1 and row["sends"] == 1 and row["recvs"] == 1
        assert row["auto"] == "p2p"
    src = ps.Layout((4096, 4096), "float32", (256, 256), [Shard(0), Shard(1)])
    dst = ps.Layout((4096, 4096), "float32", (256, 256), [Shard(1), Shard(0)])
    step = plan(src, dst).steps[0]
    assert step.max_peers() == 1


def test_big_host_buffers_start_on_a_huge_page_boundary():
    """A pooled result of 4 MiB or more starts on a 2 MiB boundary (advised to use huge
    pages: its first touch faults 2 MiB at a time where the kernel's THP setting allows);
    smaller ones are plain pages. Both are whole, writable and give their pages back."""
    import numpy as np

    for nbytes, aligned in ((5 << 20, True), ((4 << 20) + 1, True), (64 << 10, False)):
        b = _core.PooledBuffer(nbytes)
        a = np.frombuffer(b, np.uint8)
        assert a.size == nbytes
        if aligned:
            assert a.ctypes.data % (2 << 20) == 0, hex(a.ctypes.data)
        a[:] = 7
        a[-1] = 9
        assert int(a[0]) == 7 and int(a[-1]) == 9
        del a, b
