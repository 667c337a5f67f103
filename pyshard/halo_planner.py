"""Halo plans: which cells of its padded block each rank receives from and sends to which
peers, from the layout and the halo widths alone (pure Python, no MPI, cached like plans).

A rank's ghost region is its box grown by the halo widths (wrapped on periodic dims); what it
receives from rank q is that region intersected with q's box, per wrap image, and what it
sends is the mirror of that. Every box comes from the shard table, identical on every rank,
so setting up an exchange needs no communication, whatever the mesh, nested sharding,
uneven or empty shards, or widths wider than a neighbour's block (the ghosts then come from
two or more ranks away). The peers are found by bisection over the shard offsets: a rank's
setup grows with its neighbours, not with the number of ranks. :mod:`pyshard.halo` runs
these plans.

Semantics, per ghost cell at global index ``g = box start - width + padded index`` (per
dim): where ``g`` lies inside the global shape on every dim, or outside only on periodic
dims (wrapped modulo the extent), an update writes the owner's current value there; where
``g`` lies outside on a non-periodic dim, an update never writes it (it keeps what the user
put there: boundary conditions); with ``corners=False`` (a star stencil), cells outside the
owned box on two or more dims are never written. An update never writes the interior.
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_left, bisect_right
from math import prod
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from ._lru import memoize
from .layout import Layout, Partial, placements_str, ravel, unravel

__all__ = ["HaloPlan", "HaloSpec", "PeriodicArg", "WidthArg", "halo_plan", "halo_spec"]

Coords = Tuple[int, ...]
Interval = Tuple[int, int]
Region = Tuple[Interval, ...]  # a global box, (start, stop) per dim
BoxSpec = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (start, extent) in a padded array

WidthArg = Union[int, Sequence[int]]
PeriodicArg = Union[bool, Sequence[bool]]


class HaloSpec:
    """Validated halo arguments: ``width`` and ``periodic`` per array dim, ``corners``."""

    __slots__ = ("width", "periodic", "corners", "_key")

    def __init__(self, width: Tuple[int, ...], periodic: Tuple[bool, ...], corners: bool):
        self.width = width
        self.periodic = periodic
        self.corners = corners
        self._key = (width, periodic, corners)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HaloSpec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        stencil = "box" if self.corners else "star"
        return f"HaloSpec(width={self.width}, periodic={self.periodic}, {stencil} stencil)"


def _per_dim(value: object, ndim: int, name: str) -> tuple:
    if isinstance(value, np.ndarray) and value.ndim == 1:  # one per dim, as a list
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != ndim:
            raise ValueError(
                f"with_halo: {name} has {len(value)} entries, the array has {ndim} dims "
                f"(give one per dim, or a single value for all)"
            )
        return tuple(value)
    return (value,) * ndim


def _is_bool(v: object) -> bool:
    return isinstance(v, (bool, np.bool_))


def halo_spec(layout: Layout, width: WidthArg, periodic: PeriodicArg = False,
              corners: bool = True) -> HaloSpec:
    """Check halo arguments against ``layout``; raise :class:`ValueError` (or
    :class:`TypeError`) naming what is wrong. Pure: the same on every rank."""
    nd = layout.ndim
    widths = _per_dim(width, nd, "width")
    out_w = []
    for d, w in enumerate(widths):
        try:
            if isinstance(w, bool):
                raise TypeError
            w = operator.index(w)
        except TypeError:
            raise TypeError(
                f"with_halo: width must be an int or one int per dim, got {width!r}"
            ) from None
        if w < 0:
            raise ValueError(f"with_halo: width for array dim {d} is {w}; widths must be >= 0")
        if w > layout.shape[d]:
            raise ValueError(
                f"with_halo: width for array dim {d} is {w}, larger than the global extent "
                f"{layout.shape[d]} of that dim"
            )
        out_w.append(w)
    pers = _per_dim(periodic, nd, "periodic")
    if not all(_is_bool(p) for p in pers):
        raise TypeError(f"with_halo: periodic must be a bool or one bool per dim, got {periodic!r}")
    if not _is_bool(corners):
        raise TypeError(f"with_halo: corners must be a bool, got {corners!r}")
    partial = [m for m, p in enumerate(layout.placements) if isinstance(p, Partial)]
    if partial:
        raise ValueError(
            f"with_halo: the layout {placements_str(layout.placements)} is Partial on mesh "
            f"dim(s) {partial}; ghost cells need owned values: reduce first (redistribute to "
            f"Shard or Replicate)"
        )
    return HaloSpec(tuple(out_w), tuple(bool(p) for p in pers), bool(corners))


# ----------------------------------------------------------------------------- planning


def _regions(lo: Coords, hi: Coords, w: Coords, box: Region, corners: bool) -> List[Region]:
    """The ghost cells of the box ``[lo, hi)`` grown by ``w`` that lie in ``box``: one region
    for a box stencil (the caller leaves out the box itself), up to two per dim (the faces)
    for a star stencil."""
    nd = len(lo)
    if corners:
        r = tuple((max(lo[d] - w[d], box[d][0]), min(hi[d] + w[d], box[d][1])) for d in range(nd))
        return [r] if all(a < b for a, b in r) else []
    out = []
    for d in range(nd):
        if w[d] == 0:
            continue
        for side in ((lo[d] - w[d], lo[d]), (hi[d], hi[d] + w[d])):
            r = tuple(
                (max(side[0], box[e][0]), min(side[1], box[e][1]))
                if e == d
                else (max(lo[e], box[e][0]), min(hi[e], box[e][1]))
                for e in range(nd)
            )
            if all(a < b for a, b in r):
                out.append(r)
    return out


def _dim_candidates(layout: Layout, d: int, coords: Coords, w: int, periodic: bool) -> list:
    """(shard index, image shift, interval) along array dim ``d`` of every shard whose box,
    shifted, comes within ``w`` of this rank's (a superset of the true neighbours, found by
    bisection: it grows with the neighbours, not with the number of shards)."""
    mdims, ext, offs = layout.table[d]
    n = layout.shape[d]
    lo, hi = layout.interval(d, coords)
    shifts = (0, -n, n) if periodic and w > 0 else (0,)
    if not mdims:
        return [(0, s, (0, n)) for s in shifts]
    out = []
    for s in shifts:
        k_hi = bisect_right(offs, hi + w - s)  # off_k <= hi + w - s
        k_lo = max(0, bisect_left(offs, lo - w - s) - 1)  # end_k >= lo - w - s
        out.extend((k, s, (offs[k], offs[k] + ext[k])) for k in range(k_lo, k_hi))
    return out


class HaloPlan:
    """The halo exchange of the rank at ``coords``: who it receives from and sends to, which
    boxes of its padded array, and the wrap-around copies onto itself. Pure Python, no MPI.

    ``recvs`` / ``sends``: ``(peer rank, peer coords, boxes)`` with ``boxes`` a tuple of
    ``(start, extent)`` in this rank's padded array, in message order (both sides order a
    message's boxes by the receiver's global region). ``local``: ``(src start, dst start,
    extent)`` copies inside the padded array (periodic wrap onto this rank itself).
    """

    __slots__ = ("layout", "spec", "coords", "rank", "padded_shape", "recvs", "sends", "local")

    def __init__(self, layout: Layout, spec: HaloSpec, coords: Coords) -> None:
        self.layout = layout
        self.spec = spec
        self.coords = coords = tuple(int(c) for c in coords)
        layout.box(coords)  # checks the coords
        mesh_shape = layout.mesh_shape
        self.rank = ravel(coords, mesh_shape)
        w = spec.width
        iv = [layout.interval(d, coords) for d in range(layout.ndim)]
        lo = tuple(a for a, _ in iv)
        hi = tuple(b for _, b in iv)
        base = tuple(a - ww for a, ww in zip(lo, w))  # global index of padded index 0
        self.padded_shape = tuple(b - a + 2 * ww for (a, b), ww in zip(iv, w))
        cands = [
            _dim_candidates(layout, d, coords, w[d], spec.periodic[d]) for d in range(layout.ndim)
        ]
        recvs: Dict[int, list] = {}
        sends: Dict[int, list] = {}
        peer_coords: Dict[int, Coords] = {}
        local = []
        for combo in itertools.product(*cands):
            q = list(coords)
            for d, (k, _, _) in enumerate(combo):
                mdims = layout.table[d][0]
                if mdims:
                    for m, c in zip(mdims, unravel(k, [mesh_shape[m] for m in mdims])):
                        q[m] = c
            qc = tuple(q)
            r = ravel(qc, mesh_shape)
            shift = tuple(s for _, s, _ in combo)
            if r == self.rank and not any(shift) and spec.corners:
                continue  # this rank's own box: the interior
            qlo = tuple(a for _, _, (a, _) in combo)
            qhi = tuple(b for _, _, (_, b) in combo)
            # receive: my ghost cells inside q's box shifted by the image
            qbox = tuple((a + s, b + s) for a, b, s in zip(qlo, qhi, shift))
            for reg in _regions(lo, hi, w, qbox, spec.corners):
                start = tuple(a - o for (a, _), o in zip(reg, base))
                ext = tuple(b - a for a, b in reg)
                if r == self.rank:
                    src = tuple(a - s - o for (a, _), s, o in zip(reg, shift, base))
                    local.append((reg, (src, start, ext)))
                else:
                    recvs.setdefault(r, []).append((reg, (start, ext)))
                    peer_coords[r] = qc
            if r == self.rank:
                continue
            # send: q's ghost cells inside my box shifted by the opposite image
            mbox = tuple((a - s, b - s) for a, b, s in zip(lo, hi, shift))
            for reg in _regions(qlo, qhi, w, mbox, spec.corners):
                start = tuple(a + s - o for (a, _), s, o in zip(reg, shift, base))
                ext = tuple(b - a for a, b in reg)
                sends.setdefault(r, []).append((reg, (start, ext)))
                peer_coords[r] = qc

        def table(d: Dict[int, list]) -> tuple:
            return tuple(
                (r, peer_coords[r], tuple(box for _, box in sorted(d[r])))
                for r in sorted(d)
            )

        self.recvs = table(recvs)
        self.sends = table(sends)
        self.local = tuple(t for _, t in sorted(local))

    # -- facts
    @property
    def itemsize(self) -> int:
        return self.layout.dtype.itemsize

    def _bytes(self, msgs: tuple) -> int:
        return sum(prod(ext) for _, _, boxes in msgs for _, ext in boxes) * self.itemsize

    @property
    def recv_bytes(self) -> int:
        return self._bytes(self.recvs)

    @property
    def send_bytes(self) -> int:
        return self._bytes(self.sends)

    @property
    def local_bytes(self) -> int:
        return sum(prod(ext) for _, _, ext in self.local) * self.itemsize

    @property
    def peers(self) -> Tuple[int, ...]:
        """Ranks this rank exchanges messages with (either way), sorted."""
        return tuple(sorted({r for r, _, _ in self.recvs} | {r for r, _, _ in self.sends}))

    def ghost_cells(self) -> int:
        """Cells of the padded array an update writes."""
        n = sum(prod(ext) for _, _, boxes in self.recvs for _, ext in boxes)
        return n + sum(prod(ext) for _, _, ext in self.local)

    def explain(self) -> str:
        """Readable text: the peers, messages and bytes of this rank's halo exchange."""
        sp, lay = self.spec, self.layout
        periodic = "".join("P" if p else "-" for p in sp.periodic)
        lines = [
            f"halo exchange {placements_str(lay.placements)} on mesh "
            f"{'x'.join(map(str, lay.mesh_shape))}, array {lay.shape} {lay.dtype}, width "
            f"{sp.width}, periodic {periodic}, {'box' if sp.corners else 'star'} stencil",
            f"  rank {self.rank} at {self.coords}: padded local shape {self.padded_shape}, "
            f"{self.ghost_cells()} ghost cells written per update",
            f"  receives {len(self.recvs)} message(s), {self.recv_bytes} B; sends "
            f"{len(self.sends)} message(s), {self.send_bytes} B; one message per peer each "
            f"way; {len(self.peers)} peer(s)",
        ]
        if self.local:
            lines.append(
                f"  periodic wrap onto itself: {len(self.local)} box(es), {self.local_bytes} B "
                f"copied locally"
            )
        isz = self.itemsize
        recv = {r: (c, b) for r, c, b in self.recvs}
        send = {r: (c, b) for r, c, b in self.sends}
        for r in self.peers:
            c = (recv.get(r) or send.get(r))[0]  # type: ignore[index]
            rb = sum(prod(e) for _, e in recv.get(r, (c, ()))[1]) * isz
            sb = sum(prod(e) for _, e in send.get(r, (c, ()))[1]) * isz
            nr, ns = len(recv.get(r, (c, ()))[1]), len(send.get(r, (c, ()))[1])
            lines.append(
                f"    peer rank {r} at {c}: receives {rb} B in {nr} box(es), sends {sb} B "
                f"in {ns} box(es)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"HaloPlan(rank {self.rank}, {len(self.peers)} peers, recv {self.recv_bytes} B, "
            f"send {self.send_bytes} B)"
        )


@memoize
def _halo_plan(layout: Layout, spec: HaloSpec, coords: Coords) -> HaloPlan:
    return HaloPlan(layout, spec, coords)


def halo_plan(layout: Layout, spec: HaloSpec, coords: Sequence[int]) -> HaloPlan:
    """The (cached) halo exchange of the rank at mesh ``coords``; no communication."""
    return _halo_plan(layout, spec, tuple(int(c) for c in coords))
