"""The CUDA copy kernel run on the host: `_core.copy_kernel_on_host` builds the device
descriptor table (runs split at 4 KiB) and the launch grid exactly as the CUDA packer does,
then runs the kernel's body (cpp/copy_kernel.h) for every (blockIdx.x, blockIdx.y, threadIdx.x)
of the grid on host buffers. Each case is compared byte for byte, over the whole buffers (so
bytes outside the destination boxes must be untouched), with numpy slicing and with the host
packer (`kernel=False`), and the report says what was launched (grid, word widths, splits), so
each case checks the situation it was written for. Serial, no GPU, no MPI communication.

A new kernel (e.g. halo packing) gets a harness entry in cpp/kernel_harness.h and its cases
here: see the header comment there."""

from __future__ import annotations

import numpy as np
import pytest

from pyshard import _core

RNG = np.random.default_rng(20261201)
DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.complex128]  # itemsize 1..16
SLACK = 48  # bytes of buffer before and after the arrays


def _align_up(v):
    return (v + 4095) & ~4095


class Buffers:
    """A source and a destination array inside random byte buffers, starting `src_offset` and
    `dst_offset` bytes into them (misaligned pointers when the offset is not a multiple of 16)."""

    def __init__(self, sshape, dshape, dtype, src_offset=0, dst_offset=0, dst_bytes=None):
        # only the itemsize matters: numpy compares and copies raw bytes (no float NaN games)
        self.dtype = np.dtype(f"V{np.dtype(dtype).itemsize}")
        self.sshape, self.dshape = list(sshape), list(dshape)
        self.so, self.do = src_offset, dst_offset
        sbytes = int(np.prod(sshape)) * self.dtype.itemsize
        dbytes = int(np.prod(dshape)) * self.dtype.itemsize if dst_bytes is None else dst_bytes
        # numpy's allocations are 16-byte aligned here; offsets are relative to that
        self.src = RNG.integers(0, 256, sbytes + src_offset + SLACK, dtype=np.uint8)
        self.dst0 = RNG.integers(0, 256, dbytes + dst_offset + SLACK, dtype=np.uint8)
        assert self.src.ctypes.data % 16 == 0 and self.dst0.ctypes.data % 16 == 0

    def view(self, raw, offset, shape):
        return np.ndarray(shape, self.dtype, buffer=raw, offset=offset)

    def expected(self, boxes):
        """numpy: the destination buffer after copying (sstart, dstart, ext) boxes."""
        ref = self.dst0.copy()
        s, d = self.view(self.src, self.so, self.sshape), self.view(ref, self.do, self.dshape)
        for sstart, dstart, ext in boxes:
            d[tuple(slice(a, a + e) for a, e in zip(dstart, ext))] = s[
                tuple(slice(a, a + e) for a, e in zip(sstart, ext))
            ]
        return ref

    def table(self, blocks):
        """Descriptor-table blocks (lists of boxes) as copy_kernel_on_host takes them."""
        return [[(self.sshape, s, self.dshape, d, e) for s, d, e in blk] for blk in blocks]

    def run(self, blocks, b0=0, b1=None):
        """The kernel on the host and the host packer over the same table; returns the
        kernel's result, the host packer's result and the kernel's report."""
        table, item = self.table(blocks), self.dtype.itemsize
        kw = dict(b0=b0, b1=b1, src_offset=self.so, dst_offset=self.do)
        out, host = self.dst0.copy(), self.dst0.copy()
        rep = _core.copy_kernel_on_host(table, item, self.src, out, **kw)
        assert _core.copy_kernel_on_host(table, item, self.src, host, kernel=False, **kw) is None
        return out, host, rep


def check_boxes(buf, boxes, **kw):
    """Every box its own table block; kernel == host packer == numpy, over the whole buffer."""
    out, host, rep = buf.run([[b] for b in boxes], **kw)
    ref = buf.expected(boxes)
    np.testing.assert_array_equal(host, ref)
    np.testing.assert_array_equal(out, ref)
    return rep


def _random_box(sshape, dshape, empty=0.0):
    """(src start, dst start, extent) of a random box fitting both arrays; empty with
    probability about `empty`."""
    lo = 0 if RNG.random() < empty else 1
    ext = [int(RNG.integers(lo, min(s, d) + 1)) for s, d in zip(sshape, dshape)]
    sstart = [int(RNG.integers(0, s - e + 1)) for s, e in zip(sshape, ext)]
    dstart = [int(RNG.integers(0, d - e + 1)) for d, e in zip(dshape, ext)]
    return sstart, dstart, ext


def _widths_used(rep):
    return {w for w, n in rep["widths"].items() if n}


@pytest.mark.parametrize("ndim", [1, 2, 3, 4, 8])
def test_random_boxes_odd_sizes(ndim):
    """Random boxes of odd extents (some empty) between random arrays of every itemsize at
    random pointer offsets."""
    lo, hi = (2, 5) if ndim == 8 else (1, {1: 600, 2: 40, 3: 13, 4: 7}[ndim])
    widths = set()
    for dtype in DTYPES:
        for _ in range(12):
            sshape = [int(RNG.integers(lo, hi)) for _ in range(ndim)]
            dshape = [int(RNG.integers(lo, hi)) for _ in range(ndim)]
            boxes = [_random_box(sshape, dshape, empty=0.1)]
            so, do = int(RNG.integers(0, 17)), int(RNG.integers(0, 17))
            rep = check_boxes(Buffers(sshape, dshape, dtype, so, do), boxes)
            widths |= _widths_used(rep)
    assert len(widths) >= 3


def test_more_looped_dims_than_a_descriptor_holds():
    """A 9-D box with 8 looped dims (a descriptor holds 6) is split along its 2 outer dims
    into 4 descriptors of 64 runs each."""
    buf = Buffers([3] * 9, [4] * 9, np.int16, 2, 6)
    rep = check_boxes(buf, [([1] * 9, [0, 1, 2, 0, 1, 2, 0, 1, 2], [2] * 9)])
    assert rep["descriptors"] == 4 and rep["runs"] == 4 * 64 and _widths_used(rep) == {2}


@pytest.mark.parametrize("row_bytes", [4096, 4097, 8192 + 24, 3 * 4096 + 1000, 65536 + 8])
def test_long_runs_split_at_4k(row_bytes):
    """Runs longer than 4 KiB are split into 4 KiB pieces plus a remainder descriptor; a run
    of exactly 4 KiB stays whole. The kernel copies at most 4 KiB per run."""
    dtype = np.uint8 if row_bytes % 8 else np.float64
    n = row_bytes // np.dtype(dtype).itemsize
    sshape, dshape = [5, n + 3], [6, n + 1]
    box = ([1, 2], [2, 0], [3, n])  # 3 rows of row_bytes each, not contiguous on either side
    rep = check_boxes(Buffers(sshape, dshape, dtype), [box])
    assert rep["max_run"] <= 4096
    whole, rem = divmod(row_bytes, 4096)
    assert rep["descriptors"] == (2 if whole and rem else 1)
    assert rep["runs"] == 3 * whole + (3 if rem else 0)
    # one contiguous 1 MiB + 1 block: one descriptor of 256 runs and its 1-byte remainder
    rep = check_boxes(Buffers([2**20 + 1], [2**20 + 9], np.uint8, 0, 8), [([0], [3], [2**20 + 1])])
    assert rep["descriptors"] == 2 and rep["runs"] == 256 + 1 and rep["grid"][0] > 1


# (itemsize, row elements, box start column, src pointer offset, dst pointer offset, width)
WIDTH_CASES = [
    (16, 9, 1, 0, 0, 16),  # 16-byte items, aligned pointers
    (8, 10, 3, 0, 0, 8),  # itemsize
    (4, 12, 1, 0, 0, 4),
    (2, 24, 1, 0, 0, 2),
    (1, 48, 1, 0, 0, 1),
    (4, 16, 2, 0, 0, 8),  # box offsets: a 16-byte row, 8-byte aligned start
    (1, 64, 2, 0, 0, 2),  # 1-byte items, 2-byte aligned everything
    (1, 64, 4, 0, 0, 4),
    (1, 64, 8, 0, 0, 8),
    (1, 64, 16, 0, 0, 16),
    (16, 9, 1, 8, 0, 8),  # pointer misalignment caps the width
    (16, 9, 1, 0, 4, 4),
    (16, 9, 1, 2, 0, 2),
    (16, 9, 1, 0, 1, 1),
    (8, 10, 3, 12, 4, 4),
]


@pytest.mark.parametrize("item,row,col,so,do,width", WIDTH_CASES)
def test_every_word_width(item, row, col, so, do, width):
    """Every word width, chosen by itemsize, box offsets and pointer alignment: the report
    says the kernel used exactly the expected one, and the bytes agree."""
    dtype = {1: np.uint8, 2: np.int16, 4: np.float32, 8: np.float64, 16: np.complex128}[item]
    shape = [7, row]
    ext = [5, row - 2 * col]
    rep = check_boxes(Buffers(shape, shape, dtype, so, do), [([1, col], [2, col], ext)])
    assert _widths_used(rep) == {width}


def test_all_pointer_misalignments():
    """Every pair of source and destination pointer offsets 0..15 for 16-byte-aligned
    descriptors: the width is the largest power of two dividing both, and the copy agrees."""
    sshape, dshape = [9, 12], [8, 14]  # float32: 48- and 56-byte rows
    boxes = [([1, 0], [0, 2], [6, 12]), ([0, 4], [7, 0], [1, 8])]
    for so in range(16):
        for do in range(16):
            rep = check_boxes(Buffers(sshape, dshape, np.float32, so, do), boxes)
            low = (so | do | 16) & -(so | do | 16)  # lowest set bit, at most 16
            assert max(_widths_used(rep)) == min(low, 8)  # the 56-byte stride caps at 8


def test_empty_tables_and_blocks():
    """Empty tables, empty blocks, zero-extent boxes and empty block ranges launch nothing and
    write nothing; an empty block between full ones is skipped."""
    buf = Buffers([6, 5], [6, 5], np.float32)
    for blocks, b0, b1 in [
        ([], 0, None),
        ([[]], 0, None),
        ([[], [([0, 0], [0, 0], [0, 3])], [([1, 1], [1, 1], [2, 0])]], 0, None),
        ([[([0, 0], [0, 0], [2, 2])], [([2, 2], [2, 2], [2, 2])]], 1, 1),
        ([[([0, 0], [0, 0], [2, 2])], [([2, 2], [2, 2], [2, 2])]], 2, 0),
        ([[([0, 0], [0, 0], [2, 2])], [], [([2, 2], [2, 2], [2, 2])]], 1, 2),
    ]:
        out, host, rep = buf.run(blocks, b0, b1)
        assert not rep["launched"] and rep["threads"] == 0
        np.testing.assert_array_equal(out, buf.dst0)
        np.testing.assert_array_equal(host, buf.dst0)
    boxes = [([0, 0], [1, 1], [2, 3]), ([3, 1], [3, 0], [3, 2])]
    out, host, rep = buf.run([[boxes[0]], [], [], [boxes[1]]])
    np.testing.assert_array_equal(out, buf.expected(boxes))
    np.testing.assert_array_equal(host, out)
    assert rep["descriptors"] == 2
    # an exchange with nothing to send or receive: empty pack/unpack/local tables
    g = _core.ExchangeGeometry(4, 4, [6, 5], [6, 5], [], [], [])
    for name in ("pack", "unpack", "local"):
        out = buf.dst0.copy()
        assert not _core.copy_kernel_on_host(g, name, buf.src, out)["launched"]
        np.testing.assert_array_equal(out, buf.dst0)


@pytest.mark.parametrize("so,do", [(0, 0), (4, 2), (1, 3)])
def test_block_ranges(so, do):
    """Blocks b0..b1 of a table of several blocks (what the point-to-point path launches per
    peer): only those blocks' boxes are written; every range of a 5-block table."""
    sshape, dshape = [13, 11, 7], [12, 9, 8]
    # disjoint destinations: box i in rows 2i, 2i + 1 of the destination
    boxes = []
    for i in range(5):
        ext = [int(RNG.integers(1, 3)), int(RNG.integers(1, 10)), int(RNG.integers(1, 8))]
        sstart = [int(RNG.integers(0, s - e + 1)) for s, e in zip(sshape, ext)]
        dstart = [2 * i] + [int(RNG.integers(0, d - e + 1)) for d, e in zip(dshape[1:], ext[1:])]
        boxes.append((sstart, dstart, ext))
    boxes[2] = ([0, 0, 0], [4, 0, 0], [2, 0, 3])  # an empty block in the middle
    buf = Buffers(sshape, dshape, np.int16, so, do)
    launched = 0
    for b0 in range(6):
        for b1 in range(b0, 6):
            out, host, rep = buf.run([[b] for b in boxes], b0, b1)
            ref = buf.expected(boxes[b0:b1])
            np.testing.assert_array_equal(host, ref)
            np.testing.assert_array_equal(out, ref)
            launched += rep["launched"]
            if rep["launched"] and b0 > 0:
                assert rep["first"] > 0
    assert launched >= 10


def _box(shape, first=None):
    """A random non-empty box of `shape` (start, extent); rows first, first + 1 if given."""
    ext = [int(RNG.integers(1, n + 1)) for n in shape]
    start = [int(RNG.integers(0, n - e + 1)) for n, e in zip(shape, ext)]
    if first is not None:
        ext[0], start[0] = min(ext[0], 2), first
    return start, ext


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.complex128])
def test_exchange_geometry_tables(dtype):
    """An ExchangeGeometry's pack (array -> 4 KiB-aligned workspace blocks), unpack
    (workspace -> array) and local (array -> array) tables, as the steps build them, at
    aligned and misaligned pointers; each block range of the pack table too."""
    item = np.dtype(dtype).itemsize
    sshape, dshape = [11, 9, 7], [10, 12, 5]
    sends = [(p, *_box(sshape)) for p in range(1, 5)]
    recvs = [(p, *_box(dshape, first=2 * p - 2)) for p in range(1, 5)]  # disjoint boxes
    s0, ext = _box([min(a, b) for a, b in zip(sshape, dshape)])
    local = [(s0, [int(RNG.integers(0, d - e + 1)) for d, e in zip(dshape, ext)], ext)]
    g = _core.ExchangeGeometry(5, item, sshape, dshape, sends, recvs, local)
    dbytes = int(np.prod(dshape)) * item
    ws = sum(_align_up(int(np.prod(e)) * item) for _, _, e in sends)
    rws = sum(_align_up(int(np.prod(e)) * item) for _, _, e in recvs)
    for so, do in [(0, 0), (8, 4), (3, 1)]:
        # pack: block i lands at the 4 KiB-aligned workspace offset of the blocks before it
        buf = Buffers(sshape, [ws // item], dtype, so, do)
        ref, off = buf.dst0.copy(), do
        src = buf.view(buf.src, so, sshape)
        for _, s, e in sends:
            piece = src[tuple(slice(a, a + n) for a, n in zip(s, e))].tobytes()
            ref[off : off + len(piece)] = np.frombuffer(piece, np.uint8)
            off += _align_up(len(piece))
        for b0, b1 in [(0, None), (1, 3), (3, 4)]:
            out, host = buf.dst0.copy(), buf.dst0.copy()
            rep = _core.copy_kernel_on_host(g, "pack", buf.src, out, b0, b1, so, do)
            _core.copy_kernel_on_host(g, "pack", buf.src, host, b0, b1, so, do, kernel=False)
            np.testing.assert_array_equal(out, host)
            if b1 is None:
                np.testing.assert_array_equal(out, ref)
                assert rep["launched"]
        # unpack: workspace -> destination array, against the host packer
        wsbuf = RNG.integers(0, 256, rws + so + SLACK, dtype=np.uint8)
        dst0 = RNG.integers(0, 256, dbytes + do + SLACK, dtype=np.uint8)
        out, host = dst0.copy(), dst0.copy()
        _core.copy_kernel_on_host(g, "unpack", wsbuf, out, src_offset=so, dst_offset=do)
        _core.copy_kernel_on_host(
            g, "unpack", wsbuf, host, src_offset=so, dst_offset=do, kernel=False
        )
        np.testing.assert_array_equal(out, host)
        assert not np.array_equal(out, dst0)
        # local: source array -> destination array, against numpy
        buf = Buffers(sshape, dshape, dtype, so, do)
        out = buf.dst0.copy()
        _core.copy_kernel_on_host(g, "local", buf.src, out, src_offset=so, dst_offset=do)
        np.testing.assert_array_equal(out, buf.expected(local))


def test_gather_and_scatter_tables():
    """The unpack table of a GatherGeometry and the pack table of a ScatterGeometry."""
    P, item = 4, 8
    dshape = [7, 10]
    recvs = [([0, 0], [7, 3]), ([0, 3], [7, 0]), ([0, 3], [7, 4]), ([0, 7], [7, 3])]
    g = _core.GatherGeometry(P, 0, item, [7, 3], dshape, recvs)
    total = sum(int(np.prod(e)) * item for _, e in recvs)
    packed = RNG.integers(0, 256, total + SLACK, dtype=np.uint8)
    dst0 = RNG.integers(0, 256, int(np.prod(dshape)) * item + SLACK, dtype=np.uint8)
    out, host = dst0.copy(), dst0.copy()
    assert _core.copy_kernel_on_host(g, "unpack", packed, out)["descriptors"] == 3
    _core.copy_kernel_on_host(g, "unpack", packed, host, kernel=False)
    np.testing.assert_array_equal(out, host)
    ref = dst0.copy()
    view = np.ndarray(dshape, np.uint64, buffer=ref)
    off = 0
    for s, e in recvs:
        n = int(np.prod(e))
        view[:, s[1] : s[1] + e[1]] = np.ndarray(e, np.uint64, buffer=packed, offset=off * item)
        off += n
    np.testing.assert_array_equal(out, ref)
    sc = _core.ScatterGeometry(P, 1, item, dshape, [7, 0], recvs)
    src = RNG.integers(0, 256, int(np.prod(dshape)) * item + SLACK, dtype=np.uint8)
    out, host = np.zeros(total + SLACK, np.uint8), np.zeros(total + SLACK, np.uint8)
    _core.copy_kernel_on_host(sc, "pack", src, out, src_offset=8, dst_offset=8)
    _core.copy_kernel_on_host(sc, "pack", src, host, src_offset=8, dst_offset=8, kernel=False)
    np.testing.assert_array_equal(out, host)
    assert out.any()


def test_thousands_of_descriptors():
    """Thousands of blocks (an exchange with 3000 peers: one strided descriptor each), more
    descriptors than the grid's y dimension holds (70,000 > 65,535: blockIdx.y strides), and
    one 3-D box with thousands of runs (the x dimension's warps stride over them)."""
    P, rows, cols = 3001, 40, 3
    sshape = [rows, (P - 1) * cols + 1]
    sends = [(p, [0, (p - 1) * cols], [rows, cols]) for p in range(1, P)]
    g = _core.ExchangeGeometry(P, 4, sshape, sshape, sends, [], [])
    assert g.descriptors == P - 1
    src = RNG.integers(0, 256, int(np.prod(sshape)) * 4 + 4, dtype=np.uint8)
    blk = rows * cols * 4
    out = np.zeros((P - 1) * _align_up(blk) + 4, np.uint8)
    rep = _core.copy_kernel_on_host(g, "pack", src, out, src_offset=4)
    assert rep["descriptors"] == P - 1 and rep["grid"][1] == P - 1
    a = np.ndarray(sshape, np.uint32, buffer=src, offset=4)
    got = out[: (P - 1) * _align_up(blk)].reshape(P - 1, _align_up(blk))[:, :blk]
    want = a[:, : (P - 1) * cols].reshape(rows, P - 1, cols).transpose(1, 0, 2)
    np.testing.assert_array_equal(got.view(np.uint32).reshape(P - 1, rows, cols), want)
    assert not out[-4:].any()
    host = np.zeros_like(out)
    _core.copy_kernel_on_host(g, "pack", src, host, src_offset=4, kernel=False)
    np.testing.assert_array_equal(out, host)

    # 70,000 descriptors in one block: 4 of every 5 bytes of each row of a (70000, 5) array
    n = 70_000
    buf = Buffers([n, 4], [n, 5], np.uint8, 0, 1)
    boxes = [([i, 0], [i, 1], [1, 4]) for i in range(n)]
    out, host, rep = buf.run([boxes])
    assert rep["descriptors"] == n and rep["grid"] == (1, 65535)
    ref = buf.dst0.copy()
    buf.view(ref, 1, [n, 5])[:, 1:] = buf.view(buf.src, 0, [n, 4])
    np.testing.assert_array_equal(host, ref)
    np.testing.assert_array_equal(out, ref)

    # one descriptor with 4096 runs of 20 bytes: 512 thread blocks of 8 warps each
    rep = check_boxes(
        Buffers([64, 64, 7], [64, 65, 6], np.float32, 4, 12), [([0, 0, 1], [0, 1, 0], [64, 64, 5])]
    )
    assert rep["descriptors"] == 1 and rep["runs"] == 4096 and rep["grid"] == (512, 1)


def test_out_of_bounds_refused():
    """A table that reaches outside the buffers is refused before anything is copied."""
    buf = Buffers([8, 8], [8, 8], np.float32, 0, 0, dst_bytes=100)
    out = buf.dst0[:100].copy()
    with pytest.raises(IndexError):
        _core.copy_kernel_on_host(buf.table([[([0, 0], [4, 0], [4, 8])]]), 4, buf.src, out)
    np.testing.assert_array_equal(out, buf.dst0[:100])
    with pytest.raises(IndexError):
        _core.copy_kernel_on_host([], 4, buf.src, out, b0=1)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.complex128])
@pytest.mark.parametrize("corners", [True, False])
def test_halo_geometry_tables(dtype, corners):
    """A halo exchange's tables (pyshard.halo builds them from a real plan: 3-D, uneven,
    periodic, a width wider than a neighbour's block): pack (interior boxes -> one 4 KiB
    aligned message per peer), unpack (messages -> ghost boxes), and local (periodic wrap
    onto the rank itself), by the kernel against the host packer and numpy."""
    from pyshard import Layout, Shard, halo_plan, halo_spec
    from pyshard.halo import update_geometry

    layout = Layout((9, 7, 6), dtype, (3, 2, 1), [Shard(0), Shard(1), Shard(2)],
                    sizes={0: (2, 3, 4)})
    spec = halo_spec(layout, (3, 1, 2), periodic=(True, False, True), corners=corners)
    p = halo_plan(layout, spec, (0, 1, 0))
    g = update_geometry(p)
    shape, item = list(p.padded_shape), np.dtype(dtype).itemsize
    nbytes = int(np.prod(shape)) * item
    for so, do in [(0, 0), (4, 8), (1, 3)]:
        src = RNG.integers(0, 256, nbytes + so + SLACK, dtype=np.uint8)
        arr = src[so: so + nbytes].view(dtype).reshape(shape)
        # pack: each peer's boxes back to back from its message's aligned offset
        out = RNG.integers(0, 256, g.send_bytes + do + SLACK, dtype=np.uint8)
        want, host = out.copy(), out.copy()
        off = do
        for _, _, boxes in p.sends:
            at = off
            for s, e in boxes:
                piece = arr[tuple(slice(a, a + n) for a, n in zip(s, e))].tobytes()
                want[at: at + len(piece)] = np.frombuffer(piece, np.uint8)
                at += len(piece)
            off += _align_up(at - off)
        _core.copy_kernel_on_host(g, "pack", src, out, src_offset=so, dst_offset=do)
        _core.copy_kernel_on_host(g, "pack", src, host, src_offset=so, dst_offset=do,
                                  kernel=False)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(host, want)
        # unpack: the receive buffer into the ghost boxes, nothing else touched
        ws = RNG.integers(0, 256, g.recv_bytes + so + SLACK, dtype=np.uint8)
        dst = RNG.integers(0, 256, nbytes + do + SLACK, dtype=np.uint8)
        out, host, want = dst.copy(), dst.copy(), dst.copy()
        warr = want[do: do + nbytes].view(dtype).reshape(shape)
        off = so
        for _, _, boxes in p.recvs:
            at = off
            for s, e in boxes:
                n = int(np.prod(e)) * item
                warr[tuple(slice(a, a + k) for a, k in zip(s, e))] = (
                    ws[at: at + n].view(dtype).reshape(e))
                at += n
            off += _align_up(at - off)
        _core.copy_kernel_on_host(g, "unpack", ws, out, src_offset=so, dst_offset=do)
        _core.copy_kernel_on_host(g, "unpack", ws, host, src_offset=so, dst_offset=do,
                                  kernel=False)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(host, want)
        # local: interior -> ghost cells of the same array (here into a copy)
        dst = RNG.integers(0, 256, nbytes + do + SLACK, dtype=np.uint8)
        out, want = dst.copy(), dst.copy()
        warr = want[do: do + nbytes].view(dtype).reshape(shape)
        for s, t, e in p.local:
            warr[tuple(slice(a, a + k) for a, k in zip(t, e))] = (
                arr[tuple(slice(a, a + k) for a, k in zip(s, e))])
        assert p.local  # the periodic dims wrap onto this rank
        _core.copy_kernel_on_host(g, "local", src, out, src_offset=so, dst_offset=do)
        np.testing.assert_array_equal(out, want)


# --- the fold-combine kernel (cpp/combine_kernel.h) ---------------------------------------

# FoldKind codes (cpp/fold_kind.h) of the dtypes the kernel combines
FOLD_KINDS = {np.float32: 0, np.float64: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
              np.uint8: 6, np.uint16: 7, np.uint32: 8, np.uint64: 9, np.complex64: 10,
              np.complex128: 11}
FOLD_OPS = {"sum": 0, "max": 1, "min": 2}


def _fold_values(dtype, shape):
    """Values whose float sums depend on the order (so a different order shows), with NaNs in
    the floats (max/min: NaN wins), and ints that wrap when summed."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "f":
        v = (RNG.standard_normal(n) * 10.0 ** RNG.integers(-8, 9, n)).astype(dt)
        v[RNG.random(n) < 0.02] = np.nan
    elif dt.kind == "c":
        v = (RNG.standard_normal(n) * 10.0 ** RNG.integers(-8, 9, n)
             + 1j * RNG.standard_normal(n)).astype(dt)
    else:
        info = np.iinfo(dt)
        v = RNG.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return v.reshape(shape)


def _numpy_fold(acc, src, boxes, op):
    """numpy's combine of (src_start, dst_start, extent) boxes in order, as the host fold."""
    f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    with np.errstate(over="ignore", invalid="ignore"):
        for s, d, e in boxes:
            t = tuple(slice(a, a + k) for a, k in zip(d, e))
            acc[t] = f(acc[t], src[tuple(slice(a, a + k) for a, k in zip(s, e))])
    return acc


@pytest.mark.parametrize("dtype", list(FOLD_KINDS))
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_combine_kernel_against_host_fold_and_numpy(dtype, op):
    """Overlapping destination boxes combined in table order (the fold's order rule): the
    kernel's body, one launch a descriptor, gives the host fold's bits and numpy's, for every
    element kind and op (complex: sum only, max/min refused as on the host)."""
    dt = np.dtype(dtype)
    sshape, dshape = [7, 9, 5], [6, 8, 6]
    boxes = [([0, 0, 0], [1, 1, 0], [4, 5, 5]), ([2, 3, 1], [2, 2, 1], [4, 6, 4]),
             ([1, 1, 0], [0, 0, 0], [6, 8, 3]), ([6, 8, 4], [3, 4, 2], [1, 1, 1]),
             ([0, 0, 0], [5, 7, 5], [0, 1, 1])]  # overlapping, plus an empty one
    src = _fold_values(dt, sshape)
    dst = _fold_values(dt, dshape)
    blocks = [[(sshape, s, dshape, d, e) for s, d, e in boxes[:2]], [],
              [(sshape, s, dshape, d, e) for s, d, e in boxes[2:]]]
    if dt.kind == "c" and op != "sum":
        with pytest.raises(ValueError, match="no combine"):
            _core.combine_kernel_on_host(blocks, dt.itemsize, FOLD_KINDS[dtype], FOLD_OPS[op],
                                         src, dst.copy())
        return
    out, host = dst.copy(), dst.copy()
    launches = _core.combine_kernel_on_host(blocks, dt.itemsize, FOLD_KINDS[dtype],
                                            FOLD_OPS[op], src, out)
    _core.combine_kernel_on_host(blocks, dt.itemsize, FOLD_KINDS[dtype], FOLD_OPS[op], src,
                                 host, kernel=False)
    assert launches == 4  # the empty box launches nothing
    want = _numpy_fold(dst.copy(), src, boxes, op)
    assert out.tobytes() == host.tobytes()
    assert out.tobytes() == want.tobytes()
    # a block range: the second half only
    out2 = dst.copy()
    _core.combine_kernel_on_host(blocks, dt.itemsize, FOLD_KINDS[dtype], FOLD_OPS[op], src,
                                 out2, b0=1, b1=3)
    assert out2.tobytes() == _numpy_fold(dst.copy(), src, boxes[2:], op).tobytes()


def test_combine_kernel_long_runs_and_many_warps():
    """Runs longer than a warp's 32 lanes (not split, unlike the copy kernel's), more runs
    than one block has warps, and a contiguous 1-D box of 10^5 elements: a grid of many
    blocks, every element combined once."""
    for sshape, dshape, box in [([3, 1000], [4, 1003], ([0, 1], [1, 2], [3, 999])),
                                ([300, 40], [301, 41], ([0, 0], [1, 1], [300, 40])),
                                ([100_000], [100_003], ([0], [3], [100_000]))]:
        src = RNG.standard_normal(sshape)
        dst = RNG.standard_normal(dshape)
        out = dst.copy()
        n = _core.combine_kernel_on_host([[(sshape, *box[:1], dshape, *box[1:])]], 8, 1, 0,
                                         src, out)
        assert n == 1
        assert out.tobytes() == _numpy_fold(dst.copy(), src, [box], "sum").tobytes()


def test_combine_kernel_refuses_bad_input():
    """Out-of-bounds boxes refused before anything is combined; a misaligned element (an
    8-byte kind at a 4-byte offset) trapped as the device would; unknown kinds and ops."""
    src, dst = np.zeros((4, 4)), np.zeros((4, 4))
    with pytest.raises(IndexError):
        _core.combine_kernel_on_host([[([4, 4], [0, 0], [4, 4], [1, 1], [3, 4])]], 8, 1, 0,
                                     src, dst)
    raw = np.zeros(8 * 16 + 4, np.uint8)
    mis = raw[4:4 + 8 * 16]  # float64 elements 4 bytes off their alignment
    with pytest.raises(RuntimeError, match="misaligned"):
        _core.combine_kernel_on_host([[([16], [0], [16], [0], [16])]], 8, 1, 0, mis, mis.copy())
    with pytest.raises(ValueError, match="kind"):
        _core.combine_kernel_on_host([[([4], [0], [4], [0], [4])]], 8, 12, 0, src, dst)
    with pytest.raises(ValueError, match="op"):
        _core.combine_kernel_on_host([[([4], [0], [4], [0], [4])]], 8, 1, 3, src, dst)
    with pytest.raises(ValueError, match="no combine"):
        _core.combine_kernel_on_host([[([4], [0], [4], [0], [4])]], 8, -1, 0, src, dst)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.complex64])
@pytest.mark.parametrize("corners", [True, False])
def test_combine_kernel_runs_a_halo_fold(dtype, corners):
    """A fold's whole combine as HaloStep::wait runs it on a device (cpp/device_fold.h): the
    received messages before this rank's place, its periodic wraps within the array (ghost
    boxes -> interior, overlapping at the corners), then the rest; against numpy in the
    fold's order rule (pyshard.halo's own combine for cupy arrays), bit for bit."""
    from pyshard import Layout, Shard, halo_plan, halo_spec
    from pyshard.halo import fold_geometry

    dt = np.dtype(dtype)
    layout = Layout((9, 7, 6), dt, (3, 2, 1), [Shard(0), Shard(1), Shard(2)],
                    sizes={0: (2, 3, 4)})
    spec = halo_spec(layout, (3, 1, 2), periodic=(True, False, True), corners=corners)
    p = halo_plan(layout, spec, (1, 0, 0))
    g = fold_geometry(p)
    shape = list(p.padded_shape)
    kind = FOLD_KINDS[dtype]
    arr0 = _fold_values(dt, shape)
    recv = _fold_values(dt, (g.recv_bytes // dt.itemsize,)).view(np.uint8)
    out = arr0.copy()
    at = g.local_at
    _core.combine_kernel_on_host(g, "unpack", kind, 0, recv, out, b0=0, b1=at)
    _core.combine_kernel_on_host(g, "local_unpack", kind, 0, out, out, same=True)
    _core.combine_kernel_on_host(g, "unpack", kind, 0, recv, out, b0=at)
    # numpy, in the order rule: messages by peer, this rank's wraps at its place
    want = arr0.copy()
    assert p.local  # (the periodic dims wrap onto this rank)

    def messages(lo, hi):
        for (_, _, boxes), off in list(zip(p.sends, g.recv_offsets))[lo:hi]:
            for s, e in boxes:
                n = int(np.prod(e)) * dt.itemsize
                piece = recv[off: off + n].view(dt).reshape(e)
                _numpy_fold(want, piece, [([0] * len(e), s, e)], "sum")
                off += n

    messages(0, at)
    for s, t, e in p.local:  # ghost box t into interior box s
        _numpy_fold(want, want, [(t, s, e)], "sum")
    messages(at, len(p.sends))
    assert out.tobytes() == want.tobytes()
