"""Placements, split rules and layouts: pure Python, no MPI, identical on every rank.

A :class:`Layout` records, for every array dim, which mesh dims shard it and the extent and
offset held at every shard index (the *shard table*). Every rank can therefore compute every
other rank's box from the layout alone; no collective is ever spent on shapes.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from math import prod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dtypes
from ._lru import memoize

__all__ = [
    "Placement",
    "Shard",
    "Replicate",
    "Partial",
    "Layout",
    "split_sizes",
    "Placed",
    "relaid",
    "sizes_key",
    "REDUCE_OPS",
]

REDUCE_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base class of the per-mesh-dim placements."""

    __slots__ = ()


@dataclass(frozen=True)
class Shard(Placement):
    """This mesh dim splits array dim ``dim`` into one shard per mesh coordinate."""

    dim: int

    def __post_init__(self) -> None:
        if type(self.dim) is int:  # the common case, cheap: placements are built per call
            return
        if isinstance(self.dim, bool) or not isinstance(self.dim, numbers.Integral):
            raise TypeError(f"Shard(dim): dim must be an int, got {self.dim!r}")
        object.__setattr__(self, "dim", int(self.dim))

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """Every rank along this mesh dim holds the same data."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial(Placement):
    """Ranks along this mesh dim hold partial values; the array is their reduction by ``op``.

    ``op`` is one of ``sum``, ``avg``, ``max``, ``min``.
    """

    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in REDUCE_OPS:
            raise ValueError(f"Partial(op): op must be one of {REDUCE_OPS}, got {self.op!r}")

    def __str__(self) -> str:
        return f"P({self.op})"


# the placements a layout takes: exactly these (a subclass pyshard defines goes here too)
_KINDS = (Shard, Replicate, Partial)

# ----------------------------------------------------------------------------- split rules

_RULES = ("balanced", "chunk")


def unravel(k: int, shape: Sequence[int]) -> List[int]:
    """Row-major coordinates of index ``k`` in ``shape``."""
    out = []
    for s in reversed(shape):
        k, r = divmod(k, s)
        out.append(r)
    return out[::-1]


def ravel(coords: Sequence[int], shape: Sequence[int]) -> int:
    """Row-major index of ``coords`` in ``shape`` (the inverse of :func:`unravel`)."""
    k = 0
    for c, s in zip(coords, shape):
        k = k * s + c
    return k


def _as_count(value: object, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def split_sizes(n: int, parts: int, rule: str = "balanced", grain: int = 1) -> Tuple[int, ...]:
    """Extents of ``parts`` shards of an extent ``n``: always ``parts`` entries summing to ``n``.

    rule: ``"balanced"`` is numpy.array_split (the first ``n % parts`` parts get one more);
    ``"chunk"`` is torch.chunk (parts of ceil(n / parts), the remainder last), padded with
    empty parts where torch.chunk would return fewer.
    grain: every part but the last is a multiple of ``grain``; the split is made in whole
    grains and the remainder ``n % grain`` goes to the last part.
    """
    n = _as_count(n, "split_sizes(n)")
    parts = _as_count(parts, "split_sizes(parts)")
    grain = _as_count(grain, "split_sizes(grain)")
    if n < 0:
        raise ValueError(f"split_sizes(n): must be >= 0, got {n}")
    if parts < 1:
        raise ValueError(f"split_sizes(parts): must be >= 1, got {parts}")
    if grain < 1:
        raise ValueError(f"split_sizes(grain): must be >= 1, got {grain}")
    if rule not in _RULES:
        raise ValueError(f"split_sizes(rule): must be one of {_RULES}, got {rule!r}")
    units, rest = divmod(n, grain)
    if rule == "balanced":
        q, r = divmod(units, parts)
        out = [q + 1] * r + [q] * (parts - r)
    else:
        c = -(-units // parts) if units else 0
        out = []
        left = units
        for _ in range(parts):
            take = min(c, left)
            out.append(take)
            left -= take
    out = [u * grain for u in out]
    out[-1] += rest
    return tuple(out)


# ----------------------------------------------------------------------------- layout

SizesArg = Optional[Mapping[int, Sequence[int]]]


def _check_shape(shape: object, name: str) -> Tuple[int, ...]:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints, got {shape!r}")
    out = tuple(_as_count(s, f"{name} entry") for s in shape)
    if any(s < 0 for s in out):
        raise ValueError(f"{name} must have non-negative extents, got {out}")
    return out


def check_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """numpy dtype of a number or bool, or one of ml_dtypes' floats (bfloat16, float8_*, ...;
    a name such as ``"bfloat16"`` imports ml_dtypes, or raises TypeError naming the extra to
    install); object, string and structured dtypes are refused."""
    try:
        dt = _dtypes.resolve(dtype, name)
    except _dtypes.NeedsMLDtypes:
        raise
    except TypeError as e:
        raise TypeError(f"{name}: not a numpy dtype: {dtype!r}") from e
    if _dtypes.is_ml(dt):
        if not _dtypes.is_ml_float(dt):
            raise TypeError(
                f"{name}: pyshard moves ml_dtypes' floats (bfloat16, float8_*, float6_*, "
                f"float4_*), not its sub-byte integers; got dtype {dt}"
            )
        return dt
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(
            f"{name}: pyshard moves numeric and bool arrays only, got dtype {dt} (kind {dt.kind!r})"
        )
    return dt


def check_placements(placements: object, ndim_mesh: int, ndim_array: int) -> Tuple[Placement, ...]:
    """Validate a placements list against the mesh and array ranks; negative Shard dims wrap."""
    if isinstance(placements, Placement) or not isinstance(placements, (list, tuple)):
        raise TypeError(
            f"placements must be a list of Shard/Replicate/Partial, one per mesh dim, "
            f"got {placements!r}"
        )
    out = []
    for i, p in enumerate(placements):
        # exact types: the bare base class, or a class of the caller's, would act as Replicate
        if type(p) not in _KINDS:
            raise TypeError(
                f"placements[{i}] must be Shard(dim), Replicate() or Partial(op), got {p!r}"
            )
        if isinstance(p, Shard):
            d = p.dim + ndim_array if p.dim < 0 else p.dim
            if not 0 <= d < ndim_array:
                raise ValueError(
                    f"placements[{i}] = {p!r}: dim out of range for an array of ndim {ndim_array}"
                )
            p = Shard(d)
        out.append(p)
    if len(out) != ndim_mesh:
        raise ValueError(
            f"placements has {len(out)} entries but the mesh has {ndim_mesh} dims: give one "
            f"placement per mesh dim"
        )
    return tuple(out)


class Layout:
    """How a global array of ``shape`` and ``dtype`` lies on a mesh of ``mesh_shape``.

    ``placements`` has one entry per mesh dim. An array dim sharded by several mesh dims
    (nested sharding, e.g. ``[Shard(0), Shard(0)]``) is split by the earlier mesh dim first.
    ``sizes`` maps an array dim to its shard extents, one per shard along that dim (the
    product of the sizes of the mesh dims sharding it, ordered row-major over those mesh
    dims); dims not named are split by ``rule`` (default ``"balanced"``).

    The shard table is ``table[d] = (mesh_dims, extents, offsets)``; it is the same on every
    rank, and :meth:`box` gives the global region held at any mesh coordinates.
    """

    __slots__ = ("shape", "dtype", "mesh_shape", "placements", "table", "_key", "_hash")

    def __init__(
        self,
        shape: Union[int, Sequence[int]],
        dtype: object,
        mesh_shape: Union[int, Sequence[int]],
        placements: Sequence[Placement],
        sizes: SizesArg = None,
        rule: str = "balanced",
    ) -> None:
        if rule not in _RULES:
            raise ValueError(f"Layout(rule): must be one of {_RULES}, got {rule!r}")
        shape_ = _check_shape(shape, "global_shape")
        dtype_ = check_dtype(dtype)
        mesh_shape_ = _check_shape(mesh_shape, "mesh shape")
        if not mesh_shape_ or any(m < 1 for m in mesh_shape_):
            raise ValueError(f"mesh shape must be non-empty and positive, got {mesh_shape_}")
        placements_ = check_placements(placements, len(mesh_shape_), len(shape_))
        _check_reductions(placements_, dtype_)
        sharding: Dict[int, list] = {}
        for m, p in enumerate(placements_):
            if isinstance(p, Shard):
                sharding.setdefault(p.dim, []).append(m)
        sizes = _check_sizes(sizes, shape_, mesh_shape_, sharding)
        table = []
        for d, n in enumerate(shape_):
            mdims = tuple(sharding.get(d, ()))
            if not mdims:
                table.append(((), (n,), (0,)))
                continue
            ext = sizes.get(d)
            if ext is None:
                ext = _nested_split(n, [mesh_shape_[m] for m in mdims], rule)
            offs = tuple(int(x) for x in np.concatenate(([0], np.cumsum(ext)[:-1])))
            table.append((mdims, tuple(ext), offs))
        self._set_state((shape_, dtype_, mesh_shape_, placements_, tuple(table)))

    def _set_state(self, state: tuple) -> None:
        """Set the five facts and the key and hash derived from them: the only writes a
        Layout takes (it is immutable afterwards: a reassigned attribute would leave the key,
        the hash and every plan cached under them describing another layout)."""
        shape, dtype, mesh_shape, placements, table = state
        for name, value in zip(("shape", "dtype", "mesh_shape", "placements", "table"), state):
            object.__setattr__(self, name, value)
        key = (shape, _dtypes.name(dtype),  # dtype.str is "<V1" for every float8 format
               mesh_shape, placements, table)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Layout is immutable: cannot set {name!r} (build another Layout, "
                             "or .replace(placements, sizes) for another split of the same array)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Layout is immutable: cannot delete {name!r}")

    # -- pickling (mpi4py's bcast pickles): never the cached hash, which hashes strings and so
    # differs between processes (PYTHONHASHSEED); the receiver computes its own
    def __getstate__(self) -> tuple:
        return (self.shape, self.dtype, self.mesh_shape, self.placements, self.table)

    def __setstate__(self, state: tuple) -> None:
        self._set_state(tuple(state))

    # -- identity
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self.placements)
        mesh = "x".join(str(m) for m in self.mesh_shape)
        uneven = {d: t[1] for d, t in enumerate(self.table) if t[0] and len(set(t[1])) > 1}
        extra = f", sizes={uneven}" if uneven else ""
        return f"Layout({self.shape}, {self.dtype}, [{pl}] on {mesh}{extra})"

    # -- derived facts
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def mesh_size(self) -> int:
        return prod(self.mesh_shape)

    @property
    def sizes(self) -> Dict[int, Tuple[int, ...]]:
        """Shard extents of every sharded array dim (a valid ``sizes`` argument)."""
        return {d: t[1] for d, t in enumerate(self.table) if t[0]}

    def sharding_mesh_dims(self) -> Tuple[int, ...]:
        """Mesh dims that shard some array dim, in mesh order."""
        return tuple(m for m, p in enumerate(self.placements) if isinstance(p, Shard))

    def partial_mesh_dims(self) -> Tuple[int, ...]:
        return tuple(m for m, p in enumerate(self.placements) if isinstance(p, Partial))

    def shard_index(self, d: int, coords: Sequence[int]) -> int:
        """Index along array dim ``d``'s shard list of the rank at mesh ``coords``."""
        mdims = self.table[d][0]
        return ravel([coords[m] for m in mdims], [self.mesh_shape[m] for m in mdims])

    def interval(self, d: int, coords: Sequence[int]) -> Tuple[int, int]:
        """(start, stop) along array dim ``d`` held at mesh ``coords``."""
        mdims, ext, off = self.table[d]
        if not mdims:
            return 0, self.shape[d]
        k = self.shard_index(d, coords)
        return off[k], off[k] + ext[k]

    def box(self, coords: Sequence[int]) -> Tuple[slice, ...]:
        """The global region (a tuple of slices) held at mesh ``coords``."""
        coords = self._check_coords(coords)
        return tuple(slice(*self.interval(d, coords)) for d in range(self.ndim))

    def local_shape(self, coords: Sequence[int]) -> Tuple[int, ...]:
        coords = self._check_coords(coords)
        return tuple(b - a for a, b in (self.interval(d, coords) for d in range(self.ndim)))

    def replace(self, placements: Sequence[Placement], sizes: SizesArg = None) -> Layout:
        """The same array on the same mesh with other ``placements`` (and ``sizes``)."""
        return Layout(self.shape, self.dtype, self.mesh_shape, placements, sizes)

    def _check_coords(self, coords: Sequence[int]) -> Tuple[int, ...]:
        """``coords`` as a tuple of ints inside the mesh: integers only (numpy's too), never a
        float, a string or a bool, which ``int()`` would silently turn into some rank's."""
        try:
            coords = tuple(coords)
        except TypeError:
            raise TypeError(f"coords must be a sequence of ints, got {coords!r}") from None
        if not all(type(c) is int for c in coords):  # (the common case costs one pass)
            for c in coords:
                if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral):
                    raise TypeError(f"coords must be ints, got {coords!r}")
            coords = tuple(int(c) for c in coords)
        if len(coords) != len(self.mesh_shape) or any(
            not 0 <= c < m for c, m in zip(coords, self.mesh_shape)
        ):
            raise ValueError(f"coords {coords} outside mesh {self.mesh_shape}")
        return coords


def _check_reductions(placements: Sequence[Placement], dtype: np.dtype) -> None:
    for m, p in enumerate(placements):
        if not isinstance(p, Partial):
            continue
        ml = _dtypes.is_ml_float(dtype)
        if p.op == "avg" and dtype.kind not in "fc" and not ml:
            raise ValueError(
                f"placements[{m}] = Partial('avg') needs a floating or complex dtype, got {dtype}"
            )
        if p.op in ("sum", "avg") and ml and not _dtypes.has_zero(dtype):
            raise ValueError(
                f"placements[{m}] = Partial({p.op!r}) needs a dtype with a zero; {dtype} has none"
            )
        if p.op in ("max", "min") and dtype.kind == "c":
            raise ValueError(
                f"placements[{m}] = Partial({p.op!r}) is undefined for complex dtype {dtype}"
            )
        if (dtype.kind == "f" and dtype.itemsize > 8 and not ml) or (
                dtype.kind == "c" and dtype.itemsize > 16):
            raise ValueError(
                f"placements[{m}] = Partial({p.op!r}): pyshard reduces no {dtype} (long "
                f"double: its MPI and node-shared reductions take floats of up to 64 bits); "
                f"reduce in float64 or complex128"
            )
        if not dtype.isnative:  # (MPI's and the node path's reductions read native values)
            raise ValueError(
                f"placements[{m}] = Partial({p.op!r}) needs a dtype in this machine's byte "
                f"order, got {dtype.str}: convert first, a.astype(a.dtype.newbyteorder('='))"
            )


def _nested_split(n: int, parts: Sequence[int], rule: str) -> Tuple[int, ...]:
    """Split n by the first mesh dim, then each piece by the next (earlier dim splits first)."""
    pieces = [n]
    for p in parts:
        pieces = [e for piece in pieces for e in split_sizes(piece, p, rule)]
    return tuple(pieces)


def _check_sizes(
    sizes: SizesArg,
    shape: Tuple[int, ...],
    mesh_shape: Tuple[int, ...],
    sharding: Dict[int, list],
) -> Dict[int, Tuple[int, ...]]:
    if sizes is None:
        return {}
    if not isinstance(sizes, Mapping):
        raise TypeError(
            f"sizes must be a dict {{array_dim: extents}}, got {type(sizes).__name__}: {sizes!r}"
        )
    out = {}
    for key, ext in sizes.items():
        d = _as_count(key, "sizes key (an array dim)")
        if d < 0:
            d += len(shape)
        if not 0 <= d < len(shape):
            raise ValueError(f"sizes[{key}]: array dim out of range for ndim {len(shape)}")
        if d in out:
            raise ValueError(f"sizes[{key}]: array dim {d} is given twice (as {key} and as "
                             f"{d if key != d else d - len(shape)})")
        if d not in sharding:
            raise ValueError(
                f"sizes[{key}]: array dim {d} is not sharded by any mesh dim; sizes apply to "
                f"sharded dims only"
            )
        if isinstance(ext, (str, bytes)) or not isinstance(ext, (Sequence, np.ndarray)):
            raise TypeError(f"sizes[{key}] must be a sequence of ints, got {ext!r}")
        vals = tuple(_as_count(e, f"sizes[{key}] entry") for e in ext)
        nparts = prod(mesh_shape[m] for m in sharding[d])
        if len(vals) != nparts:
            raise ValueError(
                f"sizes[{key}] has {len(vals)} extents but array dim {d} has {nparts} shards"
            )
        if any(v < 0 for v in vals):
            raise ValueError(f"sizes[{key}] has a negative extent: {vals}")
        if sum(vals) != shape[d]:
            raise ValueError(
                f"sizes[{key}] sums to {sum(vals)} but array dim {d} has extent {shape[d]}"
            )
        out[d] = vals
    return out


def placements_str(placements: Sequence[Placement]) -> str:
    return "[" + ", ".join(str(p) for p in placements) + "]"


PlacementsArg = Sequence[Union[Shard, Replicate, Partial]]


class Placed:
    """Where a rank's ``local`` block of a global array lies: the properties that
    :class:`ShardedArray` and :class:`pyshard.torch.ShardedTensor` share, read from their
    ``layout`` and ``mesh``."""

    __slots__ = ()
    layout: Layout
    mesh: Any  # a pyshard.Mesh (its coords)

    @property
    def global_shape(self) -> Tuple[int, ...]:
        return self.layout.shape

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.layout.shape

    @property
    def placements(self) -> Tuple:
        return self.layout.placements

    @property
    def box(self) -> Tuple[slice, ...]:
        """The global region this rank holds."""
        return self.layout.box(self.mesh.coords)


def sizes_key(sizes: Any) -> Optional[tuple]:
    """``sizes`` ({array dim: extents}) as a hashable, sorted tuple (a cache key); None for
    None. A value that is not such a dict raises TypeError or ValueError."""
    if sizes is None:
        return None
    if not isinstance(sizes, Mapping):
        raise TypeError(f"sizes must be a dict {{array_dim: extents}}, got {sizes!r}")
    # checked as Layout checks them (no int() of a float, a string or a bool: the key must
    # not accept what the Layout would refuse)
    return tuple(sorted((_as_count(d, "sizes key (an array dim)"),
                         tuple(_as_count(e, f"sizes[{d}] entry") for e in v))
                        for d, v in sizes.items()))


@memoize
def _relaid(like: Layout, placements: tuple, sizes: Optional[tuple]) -> Layout:
    return Layout(like.shape, like.dtype, like.mesh_shape, placements,
                  dict(sizes) if sizes is not None else None)


def relaid(like: Layout, placements: Any, sizes: Any = None) -> Layout:
    """``like``'s array (shape, dtype, mesh shape) laid out as ``placements`` (and ``sizes``):
    cached, so that a repeated redistribute does no work that grows with the number of ranks.
    Arguments that cannot be a cache key build it uncached, for the precise error."""
    try:
        return _relaid(like, tuple(placements), sizes_key(sizes))
    except (TypeError, ValueError, AttributeError):
        return Layout(like.shape, like.dtype, like.mesh_shape, placements, sizes)
