"""Differentiable redistribution of torch tensors: :class:`ShardedTensor` and the functions
that make and move one (``import pyshard.torch as pst``).

A :class:`ShardedTensor` is this rank's torch tensor ``local`` plus the pyshard
:class:`~pyshard.Layout` it belongs to. :func:`redistribute` runs pyshard's planner and core
on the tensor's memory (no copy in: the numpy or cupy view of the detached tensor; no copy
out: the result is viewed by torch) and is a ``torch.autograd.Function``: its backward
redistributes the gradient back to the source's layout through the same planner and core,
in the fewest collectives, as any redistribute.

The gradient convention (DTensor's; docs/adjoints.md, "Gradients (torch)"): the gradient
that arrives at a result is taken to be laid out like the result, with every ``Partial``
mesh dim read as ``Replicate`` (the gradient of a sum with respect to each addend is the
gradient of the sum; of a ``Partial("avg")`` result, the value's gradient divided by n, so
its backward multiplies by n). On a ``Replicate`` mesh dim every rank holds the same gradient,
counted once; ``grad_placements=`` says otherwise where the work downstream differs per
rank (``[Partial("sum")]``: the ranks' gradients are to be summed). The gradient that
leaves for the source is laid out like the source with ``Partial("sum")`` read as
``Replicate`` (``Partial("avg")`` likewise, divided by n); ``Partial("max")`` and
``Partial("min")`` sources have no such gradient (:class:`NotImplementedError`).

Every call is collective, like the pyshard call it wraps, and so is every backward: every
rank must run the same backwards in the same order (``loss.backward()`` on every rank does).

First derivatives only: a backward with ``create_graph=True`` through any of these functions
(a gradient penalty, a Hessian-vector product) raises torch's error for a function that is
``once_differentiable`` when the second backward reaches it, rather than dropping the
second-order term.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple

try:
    import torch
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pyshard.torch needs PyTorch, which is not installed: `pip install torch` (on a "
        "machine without a GPU, the CPU-only build is much smaller: `pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu`)"
    ) from _e

import numpy as np
from torch.autograd.function import once_differentiable

from . import _backend as bk
from . import _dtypes, _validate
from . import array as _array
from ._cache import memoize
from ._grad import grad_in_layout as _grad_in_layout
from ._grad import grad_out_layout as _grad_out_layout
from ._grad import grad_out_scale as _grad_out_scale
from ._grad import scaled as _scaled
from .array import Placed, ShardedArray
from .halo_planner import PeriodicArg, WidthArg
from .layout import Layout, PlacementsArg, Replicate, SizesArg, relaid
from .many import redistribute_many as _redistribute_many
from .mesh import Mesh
from .migration import Migrated
from .migration import migrate as _np_migrate
from .unstructured import GatherPlan

__all__ = [
    "ShardedTensor",
    "distribute",
    "from_local",
    "gather",
    "halo_pad",
    "migrate",
    "redistribute",
    "redistribute_many",
    "scatter",
]

log = logging.getLogger("pyshard")


# ----------------------------------------------------------------------------- conversions


def _as_array(t: torch.Tensor) -> Any:
    """The numpy (host) or cupy (GPU) view of ``t``'s memory: no copy where ``t`` is
    contiguous and carries no conjugate or negative bit (pyshard takes C-contiguous shards;
    a lazy ``.conj()`` view, or a gradient arriving as one, is made into its values). A
    tensor without memory of its own (torch.func's wrappers, meta and fake tensors) raises
    NotImplementedError; one on a device other than the CPU and CUDA, ValueError."""
    if t.device.type == "meta":
        raise NotImplementedError(
            "pyshard.torch: a meta tensor has no data: meta and fake tensors are not "
            "supported; pyshard's functions move real CPU or CUDA tensors")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"pyshard.torch: a tensor on device {t.device.type!r}: pyshard moves "
                         f"CPU and CUDA tensors")
    try:
        return _memory_of(t)
    except RuntimeError as e:
        if "storage" not in str(e):
            raise
        raise NotImplementedError(
            f"pyshard.torch: a tensor without memory of its own ({e}): torch.func transforms "
            f"(grad, vmap, vjp, jacrev), meta and fake tensors are not supported; pyshard's "
            f"functions run under torch.autograd (backward(), torch.autograd.grad)") from None


def _apply(fn: Any, *args: Any) -> Any:
    """``fn.apply(*args)``; under a torch.func transform NotImplementedError naming them
    (torch refuses an autograd Function without ``setup_context`` there, in words that name
    neither pyshard nor torch.func). Raised before any communication, so on every rank."""
    try:
        return fn.apply(*args)
    except RuntimeError as e:
        if "functorch transforms" not in str(e):
            raise
        raise NotImplementedError(
            "pyshard.torch: torch.func transforms (grad, vmap, vjp, jacrev) are not "
            "supported; pyshard's functions run under torch.autograd (backward(), "
            "torch.autograd.grad)") from None


def _memory_of(t: torch.Tensor) -> Any:
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type == "cpu" and t.dtype not in _ML_TORCH:
        try:
            return t.numpy()
        except TypeError:  # a dtype numpy lacks (complex32): DLPack's error names what we take
            return bk.as_array(t, "tensor")
    if t.device.type == "cuda" and t.dtype in _ML_TORCH:
        # DLPack (retagged), not the __cuda_array_interface__ that as_array prefers: torch
        # describes a bfloat16 tensor there as raw void words ("<V2"), a float8 one not at all
        return bk.cupy_from_dlpack(t, "tensor")
    return bk.as_array(t, "tensor")  # DLPack: bfloat16, float8 on the host; CUDA tensors


def _to_torch(a: Any) -> torch.Tensor:
    """A pyshard result as a torch tensor on the same memory."""
    # (numpy's own dtypes; not ml_dtypes', whose float8_e5m2 is kind "f" like float32 while
    # its other floats are kind "V": torch.from_numpy refuses every one of them)
    if type(a) is np.ndarray and a.dtype.kind in "biufc" and not _dtypes.is_ml(a.dtype):
        return torch.from_numpy(a)
    return torch.from_dlpack(bk.to_dlpack(a))


_ML_TORCH = tuple(
    getattr(torch, n)
    for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


@memoize
def _np_dtype(dt: torch.dtype) -> np.dtype:
    """The dtype pyshard reads a tensor of torch dtype ``dt`` as (:func:`_as_array`'s:
    numpy's, ml_dtypes' for bfloat16 and the float8s)."""
    return np.dtype(_as_array(torch.empty(0, dtype=dt)).dtype)


def _check_dtype(local: torch.Tensor, layout: Layout, what: str) -> None:
    """ValueError where ``local``'s dtype is not ``layout``'s (pyshard would read its bytes as
    the layout's dtype)."""
    try:
        got = _np_dtype(local.dtype)
    except (TypeError, ValueError, RuntimeError, BufferError) as e:
        raise ValueError(f"{what}: local tensor dtype {local.dtype} is not one pyshard moves "
                         f"({e})") from None
    if got != layout.dtype:
        raise ValueError(f"{what}: local tensor dtype {local.dtype} ({got}) disagrees with the "
                         f"layout's {layout.dtype}")


# ----------------------------------------------------------------------------- the class


class ShardedTensor(Placed):
    """This rank's torch tensor ``local`` of a global array laid out as ``layout`` on ``mesh``.

    ``local`` is an ordinary torch tensor in the caller's autograd graph; the rest describes
    where it lies: ``layout`` (a :class:`~pyshard.Layout`, whose shard table gives every
    rank's box), ``placements``, ``global_shape``, ``box`` (the global region this rank
    holds), ``mesh``.
    """

    __slots__ = ("local", "layout", "mesh")

    def __init__(self, local: torch.Tensor, layout: Layout, mesh: Mesh) -> None:
        if layout.mesh_shape != mesh.shape:
            raise ValueError(
                f"ShardedTensor: the layout is for a mesh of shape {layout.mesh_shape}, the mesh "
                f"has shape {mesh.shape}"
            )
        want = layout.local_shape(mesh.coords)
        if tuple(local.shape) != want:
            raise ValueError(
                f"local tensor {tuple(local.shape)} disagrees with the layout, which puts {want} "
                f"at mesh coords {mesh.coords}"
            )
        _check_dtype(local, layout, "ShardedTensor")
        self.local = local
        self.layout = layout
        self.mesh = mesh

    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    def __repr__(self) -> str:
        shape = tuple(self.local.shape)
        return f"ShardedTensor({self.layout!r}, local {shape} at {self.mesh.coords})"

    @classmethod
    def _wrap(cls, local: torch.Tensor, layout: Layout, mesh: Mesh) -> ShardedTensor:
        """Internal: a result built to the layout's shape (no checks)."""
        self = cls.__new__(cls)
        self.local, self.layout, self.mesh = local, layout, mesh
        return self

    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        grad_placements: Optional[PlacementsArg] = None,
        algorithm: Optional[str] = None,
    ) -> ShardedTensor:
        """:func:`redistribute` of this tensor."""
        return redistribute(self, placements, sizes, grad_placements, algorithm)

    def halo_pad(
        self, width: WidthArg, periodic: PeriodicArg = False, corners: bool = True,
        method: str = "auto",
    ) -> torch.Tensor:
        """:func:`halo_pad` of this tensor."""
        return halo_pad(self, width, periodic, corners, method)

    def to_pyshard(self) -> ShardedArray:
        """The detached values as a :class:`~pyshard.ShardedArray` (a view where ``local`` is
        contiguous; outside the autograd graph)."""
        return ShardedArray.wrap(_as_array(self.local), self.layout, self.mesh)

    def full(self) -> torch.Tensor:
        """The whole global tensor on every rank (reduced where Partial), differentiable:
        ``redistribute(self, [Replicate()] * mesh.ndim).local``."""
        return redistribute(self, [Replicate()] * self.mesh.ndim).local


# ----------------------------------------------------------------------------- making one


def from_local(
    local: torch.Tensor,
    mesh: Mesh,
    placements: PlacementsArg,
    global_shape: Optional[Sequence[int]] = None,
    sizes: SizesArg = None,
    validate: bool = False,
) -> ShardedTensor:
    """Wrap this rank's tensor ``local`` as a :class:`ShardedTensor`: ``.local`` is ``local``
    itself (no copy, still in the caller's autograd graph).

    The layout is built as :func:`pyshard.from_local` builds it (same arguments, same
    rules): with ``global_shape`` no communication, with ``global_shape=None`` one
    Allgather of the local shapes; ``validate=True`` checks a given ``global_shape`` on every
    rank at once.
    """
    a: Any
    try:
        if not isinstance(local, torch.Tensor):
            raise TypeError(f"from_local: local must be a torch.Tensor, got "
                            f"{type(local).__name__}")
        a = _as_array(local)
    except (TypeError, ValueError, NotImplementedError) as e:
        if global_shape is not None and not validate and not _validate.enabled:
            raise  # no communication follows: this rank raises alone, as pyshard.from_local
        a = _array.Refused(e)  # carried in from_local's Allgather: every rank raises it
    x = _array.from_local(a, mesh, placements, global_shape, sizes, validate)
    return ShardedTensor(local, x.layout, mesh)


def distribute(
    tensor: torch.Tensor, mesh: Mesh, placements: PlacementsArg, sizes: SizesArg = None
) -> ShardedTensor:
    """Every rank passes the same full ``tensor`` and gets its shard; no communication.

    Differentiable: this is ``redistribute`` from ``tensor`` replicated on every rank, so its
    backward gives every rank the gradient of the whole ``tensor`` (one Allgatherv of the
    gradient's shards where ``placements`` shard, nothing where they replicate). The shard
    is a copy (as :func:`pyshard.distribute` makes one); a Partial mesh dim holds the tensor
    as Replicate -> Partial does (``sum``: the value at coordinate 0, zeros elsewhere).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    full = from_local(tensor, mesh, [Replicate()] * mesh.ndim, global_shape=tuple(tensor.shape))
    return redistribute(full, placements, sizes)


# ----------------------------------------------------------------------------- the adjoint rule


def _target(like: Layout, placements: PlacementsArg, sizes: SizesArg) -> Layout:
    """``like``'s array as ``placements`` (and ``sizes``): the cached layout (layout.relaid)."""
    return relaid(like, placements, sizes)


def _as_tuple(placements: Optional[PlacementsArg]) -> Optional[tuple]:
    return None if placements is None else tuple(placements)


def _sizes_arg(layout: Layout) -> SizesArg:
    """``None`` where the balanced split gives ``layout`` (pyshard's one-lookup fast path),
    else its extents."""
    return _sizes_cached(layout)[0]


@memoize
def _sizes_cached(layout: Layout) -> tuple:  # a tuple: memoize keeps no None
    plain = _target(layout, layout.placements, None)
    return (None if plain == layout else layout.sizes,)


def _run(a: Any, src: Layout, dst: Layout, mesh: Mesh, algorithm: Optional[str]) -> Any:
    """pyshard's redistribute of the local array ``a`` from ``src`` to ``dst``."""
    if src == dst:
        return a
    x = ShardedArray.wrap(a, src, mesh)
    return x.redistribute(list(dst.placements), _sizes_arg(dst), algorithm=algorithm).local


def _move_grad(g: torch.Tensor, dtype: torch.dtype, gout: Layout, gin: Layout,
               scale: Tuple[int, int], mesh: Mesh, algorithm: Optional[str]) -> torch.Tensor:
    """The gradient ``g`` (laid out as ``gout``) redistributed to ``gin``, times
    ``scale[0] / scale[1]``."""
    if g.dtype != dtype:  # pyshard reads the memory as the layout's dtype
        g = g.to(dtype)
    if gout == gin:  # nothing moves: hand torch the gradient itself (no alias of it)
        res = g
    else:
        res = _to_torch(_run(_as_array(g), gout, gin, mesh, algorithm))
    return _scaled(res, *scale)


class _Redistribute(torch.autograd.Function):
    """Forward: pyshard's redistribute ``src -> dst``; backward: the gradient from
    ``gout`` (how it arrives) to ``gin`` (how the source's gradient lies), times
    ``scale = (mul, div)``: a Partial("avg") result's addends' gradient times their count
    (the value's gradient), divided by a Partial("avg") source's (as torch's mean divides)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, meta: tuple) -> torch.Tensor:  # type: ignore[override]
        src, dst, gout, gin, scale, mesh, algorithm = meta
        ctx.meta, ctx.dtype = meta, t.dtype
        a = _as_array(t)
        out = _to_torch(_run(a, src, dst, mesh, algorithm))
        if out.data_ptr() == t.data_ptr() and out.numel():
            out = out.clone()  # the same layout: the result would share the input's memory
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, None]:  # type: ignore[override]
        # no rank-local shortcut here: every rank runs the same collectives
        src, dst, gout, gin, scale, mesh, algorithm = ctx.meta
        return _move_grad(g, ctx.dtype, gout, gin, scale, mesh, algorithm), None


def _check_sharded(x: object, what: str) -> ShardedTensor:
    if not isinstance(x, ShardedTensor):
        raise TypeError(f"{what}: expected a pyshard.torch.ShardedTensor, got {type(x).__name__}")
    _check_dtype(x.local, x.layout, what)  # .local may have been replaced since
    return x


def _agree_noop(x: ShardedTensor, placements: PlacementsArg, sizes: SizesArg,
                algorithm: Optional[str]) -> None:
    """Validation mode: a redistribute that moves nothing on this rank agrees all the same,
    as the numpy path's does (the numpy no-op, which only agrees): a rank whose target is
    bad or differs waits in an agreement that this rank's next call would answer."""
    if _validate.enabled:
        a = ShardedArray.wrap(_as_array(x.local.detach()), x.layout, x.mesh)
        a.redistribute(placements, sizes, algorithm=algorithm)


def redistribute(
    x: ShardedTensor,
    placements: PlacementsArg,
    sizes: SizesArg = None,
    grad_placements: Optional[PlacementsArg] = None,
    algorithm: Optional[str] = None,
) -> ShardedTensor:
    """``x`` laid out as ``placements`` (and ``sizes``), differentiable; collective.

    Forward: pyshard's redistribute (its planner and core) on the memory of ``x.local``; the
    result is viewed by torch (no copy). Backward: the gradient goes back to ``x``'s layout
    by the same planner and core: the backward of a gather (``Shard -> Replicate``) is a
    local slice, of a transpose the reverse transpose, of a reduction from ``Partial("sum")``
    the identity on the gradient (every addend gets the gradient of the sum); see the module
    doc and docs/adjoints.md for the rule. ``grad_placements``: how the gradient arriving at
    the result lies, when not like the result (Partial read as Replicate); e.g.
    ``[Partial("sum")]`` on a replicated result whose ranks compute different losses from it
    (the backward then sums them). ``algorithm`` as in
    :meth:`pyshard.ShardedArray.redistribute`, for the forward and the backward.
    """
    x = _check_sharded(x, "redistribute")
    try:
        dst = _target(x.layout, placements, sizes)
    except (TypeError, ValueError) as e:  # (validation mode: the others wait in agree)
        _validate.refused(x.mesh.comm, "redistribute", e)
        raise
    if not x.local.requires_grad or not torch.is_grad_enabled():
        if grad_placements is not None:
            _grad_out_layout(dst, _as_tuple(grad_placements))  # the same errors either way
        if x.layout == dst:  # the tensor itself, as with gradients (a new tensor over its
            _agree_noop(x, placements, sizes, algorithm)  # memory hid writes from autograd)
            return ShardedTensor._wrap(x.local, dst, x.mesh)
        out = _to_torch(_run(_as_array(x.local), x.layout, dst, x.mesh, algorithm))
        return ShardedTensor._wrap(out, dst, x.mesh)
    gout = _grad_out_layout(dst, _as_tuple(grad_placements))
    gin, div = _grad_in_layout(x.layout)
    mul = _grad_out_scale(dst, _as_tuple(grad_placements))
    if x.layout == dst and gout == gin and div == mul:
        _agree_noop(x, placements, sizes, algorithm)
        return ShardedTensor._wrap(x.local, dst, x.mesh)  # nothing moves, forward or backward
    meta = (x.layout, dst, gout, gin, (mul, div), x.mesh, algorithm)
    return ShardedTensor._wrap(_apply(_Redistribute, x.local, meta), dst, x.mesh)


class _RedistributeMany(torch.autograd.Function):
    """One node for many arrays: pyshard's redistribute_many forward and backward."""

    @staticmethod
    def forward(ctx: Any, metas: list, mesh: Mesh, algorithm: Optional[str],  # type: ignore[override]
                *ts: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.metas, ctx.mesh, ctx.algorithm = metas, mesh, algorithm
        ctx.dtypes = [t.dtype for t in ts]
        xs = [ShardedArray.wrap(_as_array(t), m[0], mesh) for t, m in zip(ts, metas)]
        ys = _redistribute_many(
            xs, [list(m[1].placements) for m in metas], algorithm,
            sizes=[_sizes_arg(m[1]) for m in metas],
        )
        outs = []
        for t, y in zip(ts, ys):
            o = _to_torch(y.local)
            if o.data_ptr() == t.data_ptr() and o.numel():
                o = o.clone()
            outs.append(o)
        # the results of tensors that need no gradient carry none (nothing to move back)
        ctx.mark_non_differentiable(*[o for o, m in zip(outs, metas) if m[3] is None])
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *gs: torch.Tensor) -> tuple:  # type: ignore[override]
        metas, mesh = ctx.metas, ctx.mesh
        # the same on every rank: which tensors required grad is part of the call
        keep = [i for i, m in enumerate(metas) if m[3] is not None]
        gs = tuple(g if g.dtype == dt else g.to(dt) for g, dt in zip(gs, ctx.dtypes))
        xs = [ShardedArray.wrap(_as_array(gs[i]), metas[i][2], mesh) for i in keep]
        ys = _redistribute_many(
            xs, [list(metas[i][3].placements) for i in keep], ctx.algorithm,
            sizes=[_sizes_arg(metas[i][3]) for i in keep],
        )
        out: List[Optional[torch.Tensor]] = [None] * len(metas)
        for i, y in zip(keep, ys):
            g, m = gs[i], metas[i]
            r = g if m[2] == m[3] else _to_torch(y.local)  # unmoved: the gradient itself
            out[i] = _scaled(r, *m[4])
        return (None, None, None, *out)


def redistribute_many(
    xs: Sequence[ShardedTensor],
    placements: PlacementsArg,
    sizes: Optional[Sequence[SizesArg]] = None,
    grad_placements: Optional[PlacementsArg] = None,
    algorithm: Optional[str] = None,
) -> List[ShardedTensor]:
    """Many tensors of one mesh to ``placements`` (one list for all) together, by
    :func:`pyshard.redistribute_many` (their exchanges fused into one collective where they
    share a communicator), as one autograd node whose backward moves all the gradients the
    same way back; collective. ``sizes``: a list of ``{array_dim: extents}`` (or None) per
    tensor; ``grad_placements`` as in :func:`redistribute`, one list for all. Only the
    tensors that require grad get a gradient (a ``Partial("max")`` one that does not moves
    beside ones that do; its result requires none)."""
    xs = [_check_sharded(x, "redistribute_many") for x in xs]
    if not xs:
        return []
    mesh = xs[0].mesh
    if any(x.mesh is not mesh for x in xs):
        raise ValueError("redistribute_many: every tensor must lie on one Mesh")
    per_sizes = list(sizes) if sizes is not None else [None] * len(xs)
    if len(per_sizes) != len(xs):
        raise ValueError(f"redistribute_many: {len(per_sizes)} sizes for {len(xs)} tensors")
    dsts = [_target(x.layout, placements, s) for x, s in zip(xs, per_sizes)]
    grad = torch.is_grad_enabled() and any(x.local.requires_grad for x in xs)
    metas = []
    for x, dst in zip(xs, dsts):
        gout = _grad_out_layout(dst, _as_tuple(grad_placements))
        # only a tensor that requires grad has a gradient to place (a Partial max/min one has
        # none: NotImplementedError); the others' gradients are not moved back (gin None)
        gin, div = _grad_in_layout(x.layout) if grad and x.local.requires_grad else (None, 1)
        metas.append((x.layout, dst, gout, gin,
                      (_grad_out_scale(dst, _as_tuple(grad_placements)), div)))
    if grad:
        outs = _apply(_RedistributeMany, metas, mesh, algorithm, *[x.local for x in xs])
    else:
        arrs = [ShardedArray.wrap(_as_array(x.local), x.layout, mesh) for x in xs]
        ys = _redistribute_many(
            arrs, [list(d.placements) for d in dsts], algorithm,
            sizes=[_sizes_arg(d) for d in dsts],
        )
        # an array left where it was: the tensor itself (a new one over its memory hid
        # writes from autograd's version counter)
        outs = [x.local if x.layout == d else _to_torch(y.local)
                for x, d, y in zip(xs, dsts, ys)]
    return [ShardedTensor._wrap(o, d, mesh) for o, d in zip(outs, dsts)]


# ----------------------------------------------------------------------------- halo padding

# Every call sets up its own exchange (a HaloArray, dropped after), so only the methods whose
# setup and release are local: not "neighbor" (a neighbourhood communicator's release is
# collective, at a moment garbage collection picks rank by rank) nor "tune" (a measurement at
# every call).
HALO_PAD_METHODS = ("auto", "shm", "persistent", "p2p", "datatype")


def _halo(a: Any, layout: Layout, mesh: Mesh, spec: tuple) -> Any:
    """A HaloArray of the local array ``a`` (copied into its interior)."""
    width, periodic, corners, method = spec
    return ShardedArray.wrap(a, layout, mesh).with_halo(width, periodic, corners, method)


def halo_pad(
    x: ShardedTensor, width: WidthArg, periodic: PeriodicArg = False, corners: bool = True,
    method: str = "auto",
) -> torch.Tensor:
    """This rank's tensor with ``width`` ghost cells on each side of each dim, the ghosts
    filled as :meth:`pyshard.HaloArray.update` fills them and zeros where an update never
    writes (outside a non-periodic boundary; the corners of a star stencil); collective.

    Differentiable: the backward folds the gradient of the padded tensor
    (:meth:`pyshard.HaloArray.fold`, ``op="sum"``: every ghost cell's gradient is added to
    the cell of its owner's interior it was copied from) and returns the interior. The
    layout must have no Partial mesh dim (as for any halo). On ``Replicate`` mesh dims the
    update and so the fold stay within each replica group (the ranks with the same coords on
    the Replicate mesh dims): the padded gradient is taken to be the same on every replica of
    a block, counted once (the convention, docs/adjoints.md), and every replica gets the
    same, whole gradient of its block; nothing is summed across replicas (where replicas
    compute different losses, say so upstream with ``redistribute(...,
    grad_placements=[Partial(), ...])``, or sum the gradients).

    ``method``: how the ghost cells move, forward and backward: ``"auto"`` (the route's rule,
    :func:`pyshard.route.halo_route`: node-shared memory between ranks of a node for faces of
    at least ``PYSHARD_SHM_MIN_BYTES``, else persistent point-to-point requests), ``"shm"``,
    ``"persistent"``, ``"p2p"`` or ``"datatype"`` (host tensors), as
    :meth:`pyshard.ShardedArray.with_halo` takes them; the values and gradients are the same
    bits with every method. Each call sets up its exchange anew, so ``"neighbor"`` (whose
    communicator's release is collective) and ``"tune"`` (a measurement at every call) are
    not offered, and ``PYSHARD_HALO_METHOD`` does not apply here.
    """
    x = _check_sharded(x, "halo_pad")
    if method not in HALO_PAD_METHODS:
        err = ValueError(f"halo_pad: method must be one of {HALO_PAD_METHODS}, got {method!r}")
        _validate.refused(x.mesh.comm, "halo update", err)  # (the others wait in agree)
        raise err
    spec = (width, periodic, corners, method)
    if torch.is_grad_enabled() and x.local.requires_grad:
        return _apply(_HaloPad, x.local, (x.layout, x.mesh, spec))
    h = _halo(_as_array(x.local), x.layout, x.mesh, spec)
    h.update()
    return _to_torch(h.padded)


class _HaloPad(torch.autograd.Function):
    """Forward: a halo update of a fresh padded copy; backward: a fold of the gradient."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, meta: tuple) -> torch.Tensor:  # type: ignore[override]
        layout, mesh, spec = meta
        ctx.meta, ctx.dtype = meta, t.dtype
        h = _halo(_as_array(t), layout, mesh, spec)
        h.update()
        return _to_torch(h.padded)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, None]:  # type: ignore[override]
        layout, mesh, spec = ctx.meta
        if g.dtype != ctx.dtype:
            g = g.to(ctx.dtype)
        empty = torch.empty(layout.local_shape(mesh.coords), dtype=g.dtype, device=g.device)
        h = _halo(_as_array(empty), layout, mesh, spec)
        h.padded[...] = _as_array(g)
        h.fold("sum")
        return _to_torch(bk.xp_of(h.interior).ascontiguousarray(h.interior)), None


# ----------------------------------------------------------------------------- migrate


class _TensorMigrated(Migrated):
    """A :class:`pyshard.Migrated` whose ``rows`` are torch tensors (the structure of the
    input) and whose :meth:`back` takes and returns tensors, differentiably; everything else
    (``counts``, ``sent``, ``offsets``, ``dest``, ``n``, ``m``, ``route``, ``explain``) is the
    migration's own."""

    def __init__(self, r: Migrated, rows: Any) -> None:
        self.__dict__.update(r.__dict__)
        self.rows = rows
        self._arrays = r  # the migration of the arrays, whose back() the autograd nodes run

    def back(self, values: Any, wait: bool = True) -> Any:
        """:meth:`pyshard.Migrated.back` of tensors: each received row back to its source, in
        its original order; differentiable (the backward migrates the gradient forward).
        ``wait=False`` returns a handle that is complete already (an autograd node runs
        whole): its ``test()`` is True and its ``wait()`` gives the tensors."""
        keys, vals = _columns(values)
        out = _rebuild(values, keys, _apply(_MigrateBack, self._arrays, keys, *vals))
        return out if wait else _Complete(out)


class _Complete:
    """A handle whose operation is complete: ``wait()`` gives its result, ``test()`` is
    True."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def wait(self) -> Any:
        return self.result

    def test(self) -> bool:
        return True


def _columns(rows: Any) -> Tuple[Any, List[torch.Tensor]]:
    if isinstance(rows, dict):
        return ("dict", tuple(rows)), list(rows.values())
    if isinstance(rows, (tuple, list)):
        return (type(rows).__name__, len(rows)), list(rows)
    return ("tensor", 1), [rows]


def _rebuild(like: Any, keys: Any, out: Tuple[torch.Tensor, ...]) -> Any:
    kind = keys[0]
    if kind == "dict":
        return dict(zip(keys[1], out))
    if kind == "tensor":
        return out[0]
    return tuple(out) if kind == "tuple" else list(out)


def _grads(gs: Sequence[Optional[torch.Tensor]], like: Sequence[Any]) -> List[Any]:
    """The numpy (or cupy) arrays of the incoming gradients; zeros where torch gives None."""
    out = []
    for g, a in zip(gs, like):
        if g is None:
            out.append(np.zeros(a.shape, a.dtype) if isinstance(a, np.ndarray)
                       else bk.xp_of(a).zeros(a.shape, a.dtype))
        else:
            out.append(_as_array(g))
    return out


def migrate(rows: Any, dest: Any, mesh: Mesh, algorithm: str = "auto") -> Migrated:
    """:func:`pyshard.migrate` of torch tensors (the columns: a tensor, a tuple, list or dict
    of tensors with the same first dim), differentiable in ``rows``: the backward is
    :meth:`~pyshard.Migrated.back` of the gradient; ``dest`` (a tensor or array) has none.
    Collective, as is every backward (each rank runs the same backwards in the same order).
    Returns a :class:`pyshard.Migrated` whose ``rows`` are tensors of the same structure and
    whose ``back`` takes and returns tensors, differentiably."""
    keys, cols = _columns(rows)
    # a copy: the backward's back() reads dest again, and a dest changed in place between
    # the forward and backward() (a CPU tensor's numpy view shares its memory) would send
    # the gradients elsewhere without a word
    d = dest.detach().cpu().numpy() if isinstance(dest, torch.Tensor) else dest
    d = np.array(d, copy=True) if isinstance(d, np.ndarray) else d
    holder: List[Any] = []
    out = _apply(_Migrate, d, mesh, algorithm, holder, *cols)
    return _TensorMigrated(holder[0], _rebuild(rows, keys, out))


class _Migrate(torch.autograd.Function):
    """Forward: the rows to their dests; backward: the gradient's rows back."""

    @staticmethod
    def forward(ctx: Any, dest: Any, mesh: Mesh, algorithm: str, holder: List[Any],  # type: ignore[override]
                *cols: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        try:
            arrays = [_as_array(c) for c in cols]
        except (TypeError, ValueError, NotImplementedError) as e:
            # this rank still takes part: a column pyshard cannot move makes every rank raise
            # in the count exchange ("rank q's input is bad"), then this one raises its own
            try:
                _np_migrate([np.empty(0, object)], dest, mesh, algorithm)
            except ValueError:
                pass
            raise e from None
        r = _np_migrate(arrays, dest, mesh, algorithm)
        holder.append(r)
        ctx.r, ctx.dtypes = r, [c.dtype for c in cols]
        return tuple(_to_torch(a) for a in r.rows)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *gs: Optional[torch.Tensor]) -> Tuple[Any, ...]:  # type: ignore[override]
        r = ctx.r
        gs = tuple(g if g is None or g.dtype == dt else g.to(dt) for g, dt in zip(gs, ctx.dtypes))
        back = r.back(_grads(gs, r.rows))
        return (None, None, None, None) + tuple(_to_torch(b) for b in back)


class _MigrateBack(torch.autograd.Function):
    """Forward: each received row back to its source; backward: the gradient's rows forward
    again (the same dests)."""

    @staticmethod
    def forward(ctx: Any, r: Any, keys: Any, *vals: torch.Tensor) -> Tuple[torch.Tensor, ...]:  # type: ignore[override]
        arrays = [_as_array(v) for v in vals]
        ctx.r, ctx.dtypes, ctx.like = r, [v.dtype for v in vals], arrays
        out = r.back(list(arrays))
        return tuple(_to_torch(a) for a in out)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *gs: Optional[torch.Tensor]) -> Tuple[Any, ...]:  # type: ignore[override]
        r = ctx.r
        gs = tuple(g if g is None or g.dtype == dt else g.to(dt) for g, dt in zip(gs, ctx.dtypes))
        shapes = [(r.n,) + a.shape[1:] for a in ctx.like]
        gz = [np.zeros(s, a.dtype) if g is None else _as_array(g)
              for g, s, a in zip(gs, shapes, ctx.like)]
        fwd = _np_migrate(gz, r.dest, r.mesh, r.route.algorithm if not r.route.peers else "auto",
                          peers=r.route.peers or None)
        return (None, None) + tuple(_to_torch(a) for a in fwd.rows)


# ----------------------------------------------------------------------------- rows by index

SCATTER_OPS = ("sum", "max", "min", "replace")


def _check_plan(plan: object, what: str) -> GatherPlan:
    if not isinstance(plan, GatherPlan):
        raise TypeError(f"{what}: plan must be a pyshard.GatherPlan (pyshard.gather_plan), got "
                        f"{type(plan).__name__}")
    return plan


@memoize
def _rows_layout(like: Layout, trailing: tuple, dtype: np.dtype) -> Layout:
    """An index space laid out as ``like``'s dim 0 (its shard table), rows of shape
    ``trailing`` and ``dtype``."""
    return Layout((like.shape[0],) + trailing, dtype, like.mesh_shape, like.placements,
                  {0: like.table[0][1]})


def gather(x: ShardedTensor, plan: GatherPlan) -> torch.Tensor:
    """``x_global[plan.indices]`` on this rank: :meth:`pyshard.GatherPlan.gather` of the
    tensor, a tensor of shape ``(plan.n, *x.global_shape[1:])`` with ``x``'s dtype and
    device; collective over the plan's mesh.

    ``plan``: a :func:`pyshard.gather_plan` built for ``x``'s dim-0 layout (``like=`` any
    array laid out so, such as ``x.to_pyshard()``); ``x`` is ``[Shard(0)]`` on every mesh
    dim, its rows any trailing shape. Differentiable in ``x``: the backward is
    :meth:`pyshard.GatherPlan.scatter` of the gradient with ``op="sum"`` into zeros laid out
    as ``x`` (each row's gradient is the sum of the gradients of its copies, duplicates
    included, in the plan's order rule), so it is collective too: every rank runs the same
    backwards in the same order.
    """
    plan = _check_plan(plan, "gather")
    try:
        x = _check_sharded(x, "gather")
    except (TypeError, ValueError, NotImplementedError):
        # (what only this rank may have wrong) it takes part without rows, so that every
        # rank reading its rows raises at its wait instead of waiting; then it raises
        try:
            plan.gather(None)
        except Exception:  # noqa: BLE001 - this rank raises its own error below
            pass
        raise
    if torch.is_grad_enabled() and x.local.requires_grad:
        return _apply(_GatherRows, x.local, (plan, x.layout, x.mesh))
    return _to_torch(plan.gather(ShardedArray.wrap(_as_array(x.local), x.layout, x.mesh)))


def scatter(values: torch.Tensor, plan: GatherPlan, into: Optional[ShardedTensor] = None,
            op: str = "sum") -> ShardedTensor:
    """A new :class:`ShardedTensor`: ``into`` (zeros where None) with each row ``values[k]``
    combined into row ``plan.indices[k]`` at its owner by ``op`` (``"sum"``, ``"max"``,
    ``"min"`` or ``"replace"``), in the order rule of :mod:`pyshard.unstructured`
    (:meth:`pyshard.GatherPlan.scatter`); collective over the plan's mesh.

    ``values``: shape ``(plan.n, *rows)``; the result is laid out as ``into`` (whose dtype
    and row shape ``values`` must have), or, without ``into``, as the plan's dim 0 with rows
    of ``values``' shape and dtype, on ``values``' device. ``into`` itself is not written:
    the result is ``into + scatter(values)`` as a new tensor (for ``"sum"``), so both stay in
    the autograd graph.

    Differentiable for ``op="sum"``: in ``values`` (the backward is
    :meth:`pyshard.GatherPlan.gather` of the gradient, collective, as every backward here)
    and in ``into`` (the gradient itself). ``"max"``, ``"min"`` and ``"replace"`` are not
    linear in their operands: with a ``values`` or ``into`` that requires grad they raise
    :class:`NotImplementedError`.
    """
    plan = _check_plan(plan, "scatter")
    if op not in SCATTER_OPS:
        raise ValueError(f"scatter: op must be one of {SCATTER_OPS}, got {op!r}")
    base = None
    try:  # (what only this rank may have wrong: it still takes part, below)
        if into is not None:
            into = _check_sharded(into, "scatter")
            layout, base = into.layout, into.local
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"scatter: values must be a torch.Tensor, got "
                            f"{type(values).__name__}")
        if values.ndim < 1:
            raise ValueError("scatter: values must have a first dim (one row per index)")
        dt = _as_array(values[:0]).dtype
    except (TypeError, ValueError, NotImplementedError) as e:
        _refuse_scatter(plan, into, op)
        raise e from None
    if into is None:
        layout = _rows_layout(plan.layout, tuple(values.shape[1:]), dt)
    mesh = plan.mesh
    grad = torch.is_grad_enabled() and (
        values.requires_grad or (base is not None and base.requires_grad))
    if grad and op != "sum":
        raise NotImplementedError(
            f"scatter: no gradient through op={op!r} (not linear in its operands); scatter "
            f"with op='sum', or run this one outside the graph (torch.no_grad())")
    meta = (plan, layout, mesh, op)
    if grad:
        out = _apply(_ScatterRows, values, base, meta)
    else:
        out = _scatter_rows(values, base, meta)
    return ShardedTensor._wrap(out, layout, mesh)


def _refuse_scatter(plan: GatherPlan, into: Any, op: str) -> None:
    """This rank's values cannot be scattered: it takes part in the plan's exchange without
    values (the plan's own error path: each owner it sends to raises "rank q's values or
    into were bad" at its wait, and none waits for ever), into a scratch copy; the caller
    then raises its own error."""
    lay = getattr(into, "layout", None)
    lay = lay if isinstance(lay, Layout) else plan.layout
    scratch = ShardedArray.wrap(np.zeros(lay.local_shape(plan.mesh.coords), lay.dtype), lay,
                                plan.mesh)
    try:
        plan.scatter(np.empty(0, lay.dtype), into=scratch, op=op)
    except ValueError:
        pass


def _scatter_rows(values: torch.Tensor, base: Optional[torch.Tensor], meta: tuple
                  ) -> torch.Tensor:
    """The forward of :func:`scatter`: a fresh copy of ``base`` (zeros where None) with
    ``values`` combined in."""
    plan, layout, mesh, op = meta
    v = _as_array(values)
    if base is None:
        res = bk.xp_of(v).zeros(layout.local_shape(mesh.coords), v.dtype)
    else:
        res = bk.xp_of(v).array(_as_array(base), copy=True, order="C")
    plan.scatter(v, into=ShardedArray.wrap(res, layout, mesh), op=op)
    return _to_torch(res)


class _GatherRows(torch.autograd.Function):
    """Forward: a gather plan's gather; backward: its scatter (sum) into zeros."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, meta: tuple) -> torch.Tensor:  # type: ignore[override]
        plan, layout, mesh = meta
        ctx.meta, ctx.dtype = meta, t.dtype
        return _to_torch(plan.gather(ShardedArray.wrap(_as_array(t), layout, mesh)))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, None]:  # type: ignore[override]
        plan, layout, mesh = ctx.meta
        if g.dtype != ctx.dtype:
            g = g.to(ctx.dtype)
        ga = _as_array(g)
        res = bk.xp_of(ga).zeros(layout.local_shape(mesh.coords), ga.dtype)
        plan.scatter(ga, into=ShardedArray.wrap(res, layout, mesh), op="sum")
        return _to_torch(res), None


class _ScatterRows(torch.autograd.Function):
    """Forward: a gather plan's scatter (sum) into a copy of the base; backward: the
    gradient's gather (for the values) and the gradient itself (for the base)."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, base: Optional[torch.Tensor],  # type: ignore[override]
                meta: tuple) -> torch.Tensor:
        ctx.meta, ctx.dtype = meta, values.dtype
        return _scatter_rows(values, base, meta)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:  # type: ignore[override]
        plan, layout, mesh, _ = ctx.meta
        if g.dtype != ctx.dtype:
            g = g.to(ctx.dtype)
        gv = _to_torch(plan.gather(ShardedArray.wrap(_as_array(g), layout, mesh)))
        return gv, (g if ctx.needs_input_grad[1] else None), None
