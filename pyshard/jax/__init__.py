"""pyshard for JAX: uneven layouts, redistributes and halos inside ``jax.jit``, differentiable,
over MPI (``import pyshard.jax as psj``).

The model: one process per MPI rank, one JAX device each (CPU). Each rank holds its shard as
an ordinary ``jax.Array``; the layout (global shape, dtype, mesh shape, placements, shard
table) is static Python data that every rank knows. :class:`Sharded` carries the two through
``jit``, ``grad``, ``vmap`` and ``lax.scan`` as a pytree (the local array its one leaf), so
uneven and empty shards are just local shapes that differ per rank, and each rank compiles
its own program.

The operations plan with pyshard's planner and run the core's MPI steps through one XLA FFI
custom call (docs/jax.md):

- :func:`redistribute`: any layout to any layout; one custom call per collective step of
  the plan (one ``MPI_Alltoallv`` for a Shard->Shard transpose), the local steps in JAX;
- :func:`halo_pad` (ghost cells filled from their owners) and :func:`fold` (ghost cells
  summed into their owners: the adjoint);
- :func:`fftn` / :func:`ifftn`: ``jnp.fft`` on the axes a rank holds whole, transposes
  between.

Gradients follow pyshard.torch's convention (DTensor's, docs/adjoints.md): the VJP of a
redistribute A->B is the redistribute B->A of the cotangent, Partial read as Replicate; the
VJP of :func:`halo_pad` is :func:`fold`. ``vmap`` adds a leading, unsharded dim.

Every call communicates and is collective over the mesh (every rank must run the same
calls in the same order, forward and backward). They carry an ordered effect: XLA runs them
one at a time, in program order.
"""

from __future__ import annotations

import logging
from functools import partial
from math import prod
from typing import Any, Dict, Optional, Sequence, Tuple

try:
    import jax
    import jax.numpy as jnp
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pyshard.jax needs JAX, which is not installed: pip install 'pyshard[jax]' "
        "(or pip install 'jax[cpu]>=0.10,<0.11')"
    ) from _e

import numpy as np
from jax.tree_util import register_pytree_node_class

from .. import _validate, config
from .._backend import malloc_name
from .._dtypes import accumulator
from .._grad import grad_in_layout, grad_out_layout, grad_out_scale, scaled
from ..array import ShardedArray
from ..array import distribute as _np_distribute
from ..executor import local_slices, step_executor
from ..fft.api import plan as fft_plan
from ..fft.engine import have_scipy
from ..fft.kinds import pass_in_dtype
from ..fft.planner import Local
from ..halo_planner import HaloSpec, PeriodicArg, WidthArg, halo_plan, halo_spec
from ..layout import Layout, PlacementsArg, SizesArg, relaid
from ..mesh import Mesh
from ..planner import COLLECTIVE_KINDS, plan
from ..route import FOLD_KIND, Route
from . import _compat
from ._ops import local_fft, registered, run_halo, run_step

log = logging.getLogger(__name__)
if malloc_name() == "glibc":
    log.info("pyshard.jax: this process allocates through glibc's malloc, which gives XLA:CPU's "
             "freed buffers of 32 MiB and more back to the system, so each call's results are "
             "fresh pages; LD_PRELOAD=libtcmalloc_minimal.so.4 (Debian: libtcmalloc-minimal4) "
             "keeps them: jit'd FFTs and transposes took 0.6-0.96x the time in measurements "
             "(docs/jax.md, 'XLA's buffers and the allocator')")

__all__ = [
    "Sharded",
    "distribute",
    "fftn",
    "fold",
    "from_local",
    "full",
    "halo_pad",
    "ifftn",
    "irfftn",
    "redistribute",
    "rfftn",
    "registered",
]

JAX_VERSION = _compat.JAX_VERSION
REDUCTIONS = ("allreduce", "reduce_scatter")


@register_pytree_node_class
class Sharded:
    """This rank's shard ``local`` (a ``jax.Array``) of the array ``layout`` describes on
    ``mesh``. A pytree: ``local`` is its one leaf, ``layout`` and ``mesh`` static."""

    __slots__ = ("local", "layout", "mesh")

    def __init__(self, local: Any, layout: Layout, mesh: Mesh) -> None:
        self.local = local
        self.layout = layout
        self.mesh = mesh

    def tree_flatten(self) -> Tuple[tuple, tuple]:
        return (self.local,), (self.layout, self.mesh)

    @classmethod
    def tree_unflatten(cls, aux: tuple, children: tuple) -> Sharded:
        return cls(children[0], aux[0], aux[1])

    @property
    def shape(self) -> Tuple[int, ...]:
        """The global shape."""
        return self.layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    @property
    def placements(self) -> tuple:
        return self.layout.placements

    def redistribute(self, placements: PlacementsArg, sizes: SizesArg = None,
                     **kw: Any) -> Sharded:  # fmt: skip
        """:func:`redistribute` of this array."""
        return redistribute(self, placements, sizes, **kw)

    def halo_pad(self, width: WidthArg, periodic: PeriodicArg = False,
                 corners: bool = True) -> Any:  # fmt: skip
        """:func:`halo_pad` of this array."""
        return halo_pad(self, width, periodic, corners)

    def __repr__(self) -> str:
        return f"pyshard.jax.Sharded({self.layout!r}, local {tuple(self.local.shape)})"


# ----------------------------------------------------------------------------- checks


def _check(x: object, what: str, args: Optional[Dict[str, str]] = None) -> Sharded:
    """``x`` is a Sharded whose local array is what its layout gives this rank: raised at
    trace time, before any communication (rank-local; PYSHARD_VALIDATE=1 makes every rank
    raise, see docs/jax.md, and compares ``args`` too: the call's other arguments, as
    text, which every rank must pass alike)."""
    if not isinstance(x, Sharded):
        raise TypeError(f"{what}: expected a pyshard.jax.Sharded, got {type(x).__name__}")
    lay, mesh = x.layout, x.mesh
    bad = ""
    got = tuple(x.local.shape)
    if tuple(lay.mesh_shape) != tuple(mesh.shape):  # (agreed below in validation mode)
        bad = f"the layout's mesh shape {lay.mesh_shape} is not the mesh's {tuple(mesh.shape)}"
    elif got != (want := tuple(lay.local_shape(mesh.coords))):
        bad = f"local shape {got}, the layout gives rank {mesh.rank} {want}"
    else:
        dt = np.dtype(x.local.dtype)
        held = np.dtype(jax.dtypes.canonicalize_dtype(dt))  # what JAX makes of it
        if held != lay.dtype:
            bad = (f"local dtype {held}, the layout's is {lay.dtype}" if held == dt else
                   f"local dtype {dt}, which JAX holds as {held} (jax_enable_x64 is off), "
                   f"the layout's is {lay.dtype}")
    if _validate.enabled:  # every rank learns who is wrong, and every rank raises
        _validate.agree(mesh.comm, f"pyshard.jax.{what}", {
            "local array": f"not its shard: {bad}" if bad else "its shard",
            "layout": repr(lay),
            **(args or {}),
        })
    if bad:
        raise ValueError(f"{what}: {bad}")
    return x


def _resolved(x: object, make: Any) -> str:
    """What ``make(x)`` resolves a call's arguments to (a layout, a halo spec), as text for
    the validation mode's comparison (so that equal layouts spelt differently agree), or the
    error it raises; only where validation is on."""
    if not _validate.enabled or not isinstance(x, Sharded):
        return ""
    try:
        return repr(make(x))
    except Exception as e:  # noqa: BLE001 - compared as text, raised again by the call
        return f"{type(e).__name__}: {e}"


def _jax_dtype_ok(dt: np.dtype) -> None:
    if dt.kind not in "biufc" and dt.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise TypeError(f"pyshard.jax: dtype {dt} is not one pyshard moves")


# ----------------------------------------------------------------------------- making


def from_local(local: Any, mesh: Mesh, placements: PlacementsArg,
               global_shape: Sequence[int], sizes: SizesArg = None) -> Sharded:  # fmt: skip
    """Wrap this rank's shard ``local`` (a jax array, also a tracer inside ``jit``) as the
    array of ``global_shape`` laid out as ``placements`` (and ``sizes``) on ``mesh``; no
    communication. Raises ValueError where ``local`` is not the shard the layout gives."""
    if not isinstance(local, (jax.Array, jax.core.Tracer)):
        # a numpy (or other) array: as JAX holds it (float64 is float32 without
        # jax_enable_x64), so the layout's dtype is the one the custom calls see
        local = jnp.asarray(local)
    dt = np.dtype(local.dtype)
    _jax_dtype_ok(dt)
    lay = Layout(tuple(global_shape), dt, mesh.shape, placements, sizes)
    return _check(Sharded(local, lay, mesh), "from_local")


def distribute(global_array: Any, mesh: Mesh, placements: PlacementsArg,
               sizes: SizesArg = None) -> Sharded:  # fmt: skip
    """Every rank passes the same full array (numpy or jax) and gets its shard as a jax
    array; no communication. Eager (outside ``jit``). The dtype is JAX's for that array
    (``jnp.asarray``'s: float64 becomes float32 without ``jax_enable_x64``), the layout's
    too."""
    g = np.asarray(global_array)
    dt = jax.dtypes.canonicalize_dtype(g.dtype)
    if dt != g.dtype:
        g = g.astype(dt)
    x = _np_distribute(g, mesh, placements, sizes)
    return Sharded(jnp.asarray(x.local), x.layout, mesh)


def full(x: Sharded) -> np.ndarray:
    """The whole array on every rank as numpy (collective; eager, outside ``jit``)."""
    x = _check(x, "full")
    return ShardedArray.wrap(np.ascontiguousarray(np.asarray(x.local)), x.layout, x.mesh).full()


# ----------------------------------------------------------------------------- redistribute


def _apply(local: Any, src: Layout, dst: Layout, mesh: Mesh, algorithm: str) -> Any:
    """The plan ``src -> dst`` on this rank's array: its collective steps as custom calls,
    its local steps in JAX; reductions of float16 and the ml_dtypes floats accumulate in
    float32 and round once after the last reduction in a row, as the numpy path does."""
    if src == dst:
        return local
    p = plan(src, dst)
    coords = mesh.coords
    x = local
    for i, s in enumerate(p.steps):
        if s.kind in COLLECTIVE_KINDS:
            dt = accumulator(s.src.dtype) if s.kind in REDUCTIONS else s.src.dtype
            if np.dtype(x.dtype) != dt:
                x = x.astype(dt)
            x = run_step(x, s, mesh, algorithm, s.dst.local_shape(coords))
            if s.op == "avg":
                x = x / np.asarray(prod(s.group_shape), dt)  # (as numpy's mean: one rounding)
            nxt = p.steps[i + 1].kind if i + 1 < len(p.steps) else None
            if nxt not in REDUCTIONS and np.dtype(x.dtype) != s.dst.dtype:
                x = x.astype(s.dst.dtype)
        elif s.kind == "local_copy":
            x = x[local_slices(s.dst, s.src, coords)]
        elif s.kind == "make_partial":
            e = step_executor(s, mesh, Route("local"))
            shape = tuple(s.dst.local_shape(coords))
            if e.core is not None:
                res = jnp.full(shape, e.fill, dtype=x.dtype)
                x = res if e.zero else res.at[e.core].set(x)
            elif e.zero:
                x = jnp.zeros(shape, x.dtype)
        # relabel: the same array
    return x


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _redistribute(local: Any, meta: tuple) -> Any:
    src, dst, _, _, mesh, algorithm = meta
    return _apply(local, src, dst, mesh, algorithm)


def _redistribute_fwd(local: Any, meta: tuple) -> Tuple[Any, None]:
    return _redistribute(local, meta), None


def _redistribute_bwd(meta: tuple, _res: None, g: Any) -> tuple:
    src, _, gout, mul, mesh, algorithm = meta
    # here, not in the forward: a Partial('max'/'min') source has no gradient, but redistributes
    # (the forward) like any other; the layout is every rank's, so every rank raises alike
    gin, div = grad_in_layout(src)
    if np.dtype(g.dtype) != src.dtype:
        g = g.astype(src.dtype)
    out = _apply(g, gout, gin, mesh, algorithm)
    return (scaled(out, mul, div),)


_redistribute.defvjp(_redistribute_fwd, _redistribute_bwd)


def redistribute(x: Sharded, placements: PlacementsArg, sizes: SizesArg = None,
                 grad_placements: Optional[PlacementsArg] = None,
                 algorithm: str = "auto") -> Sharded:  # fmt: skip
    """``x`` laid out as ``placements`` (and ``sizes``: the extents of the sharded dims,
    uneven and empty shards allowed); collective. Inside ``jit`` as outside: the plan's
    collective steps run as custom calls (a Shard->Shard transpose is one
    ``MPI_Alltoallv``), ordered. ``algorithm`` of exchange steps: ``auto`` (the route's
    rule: node-shared memory where ranks of the mesh share a node and blocks move between
    them, else its MPI algorithm), ``shm``, or an MPI algorithm (``alltoallv``,
    ``alltoall``, ``p2p``, ``alltoallw``).

    Differentiable (``jax.grad``, ``jax.vjp``): the cotangent of the result goes back to
    ``x``'s layout by the reverse redistribute, with pyshard.torch's convention
    (``grad_placements`` as there)."""
    x = _check(x, "redistribute", {
        "target": _resolved(x, lambda x: relaid(x.layout, placements, sizes)),
        "algorithm": repr(algorithm), "grad_placements": repr(grad_placements)})
    dst = relaid(x.layout, placements, sizes)
    gp = None if grad_placements is None else tuple(grad_placements)
    gout = grad_out_layout(dst, gp)
    meta = (x.layout, dst, gout, grad_out_scale(dst, gp), x.mesh, algorithm)
    return Sharded(_redistribute(x.local, meta), dst, x.mesh)


# ----------------------------------------------------------------------------- halos


def _fold_layout(layout: Layout) -> Layout:
    """The layout a fold of ``layout`` combines in: float32 for the dtypes the core's
    combine does not take (float16, bfloat16, float8), itself otherwise."""
    if layout.dtype in FOLD_KIND:
        return layout
    return Layout(layout.shape, np.dtype(np.float32), layout.mesh_shape, layout.placements,
                  layout.sizes)


def _pad(local: Any, spec: HaloSpec) -> Any:
    if not spec.width:  # 0-d: nothing to pad (jnp.pad takes no empty list for ndim 0)
        return local
    return jnp.pad(local, [(w, w) for w in spec.width])


def _interior(padded: Any, spec: HaloSpec) -> Any:
    return padded[tuple(slice(w, padded.shape[d] - w) for d, w in enumerate(spec.width))]


def _update(padded: Any, layout: Layout, spec: HaloSpec, mesh: Mesh) -> Any:
    return run_halo(padded, layout, spec, mesh, False)


def _fold_sum(padded: Any, layout: Layout, spec: HaloSpec, mesh: Mesh) -> Any:
    """Every ghost cell of ``padded`` summed into its owner's cell; the interior."""
    fl = _fold_layout(layout)
    p = padded if np.dtype(padded.dtype) == fl.dtype else padded.astype(fl.dtype)
    out = _interior(run_halo(p, fl, spec, mesh, True), spec)
    return out if fl is layout else out.astype(layout.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _halo_pad(local: Any, meta: tuple) -> Any:
    layout, spec, mesh = meta
    return _update(_pad(local, spec), layout, spec, mesh)


def _halo_pad_fwd(local: Any, meta: tuple) -> Tuple[Any, None]:
    return _halo_pad(local, meta), None


def _halo_pad_bwd(meta: tuple, _res: None, g: Any) -> tuple:
    layout, spec, mesh = meta
    return (_fold_sum(g, layout, spec, mesh),)


_halo_pad.defvjp(_halo_pad_fwd, _halo_pad_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _fold(padded: Any, meta: tuple) -> Any:
    layout, spec, mesh = meta
    return _fold_sum(padded, layout, spec, mesh)


def _fold_fwd(padded: Any, meta: tuple) -> Tuple[Any, None]:
    return _fold(padded, meta), None


def _fold_bwd(meta: tuple, _res: None, g: Any) -> tuple:
    layout, spec, mesh = meta
    return (_update(_pad(g, spec), layout, spec, mesh),)


_fold.defvjp(_fold_fwd, _fold_bwd)


def halo_pad(x: Sharded, width: WidthArg, periodic: PeriodicArg = False,
             corners: bool = True) -> Any:  # fmt: skip
    """This rank's array with ``width`` ghost cells on each side of each dim, filled from
    their owners as :meth:`pyshard.HaloArray.update` fills them, zeros where an update
    never writes (outside a non-periodic boundary; a star stencil's corners); collective.

    Differentiable: the VJP is :func:`fold` (every ghost cell's cotangent added into the
    owner's cell it was copied from), pyshard.torch's convention."""
    x = _check(x, "halo_pad", {
        "halo": _resolved(x, lambda x: halo_spec(x.layout, width, periodic, corners))})
    spec = halo_spec(x.layout, width, periodic, corners)
    return _halo_pad(x.local, (x.layout, spec, x.mesh))


def fold(padded: Any, like: Sharded, width: WidthArg, periodic: PeriodicArg = False,
         corners: bool = True) -> Sharded:  # fmt: skip
    """The adjoint of :func:`halo_pad`: every ghost cell of this rank's ``padded`` array
    (``like``'s shard with ``width`` ghost cells a side) summed into the cell of its owner's
    interior that :func:`halo_pad` copies it from, in the fixed order of
    :meth:`pyshard.HaloArray.fold` (the same bits on every run); returns the interiors, laid
    out as ``like``. Collective; differentiable (its VJP is :func:`halo_pad`)."""
    bad = ""
    if isinstance(like, Sharded):
        try:
            spec = halo_spec(like.layout, width, periodic, corners)
            want = tuple(halo_plan(like.layout, spec, like.mesh.coords).padded_shape)
            if tuple(padded.shape) != want:
                bad = (f"fold: padded has shape {tuple(padded.shape)}, this rank's padded "
                       f"shard is {want}")
            elif np.dtype(padded.dtype) != like.layout.dtype:
                bad = (f"fold: padded has dtype {np.dtype(padded.dtype)}, like's layout "
                       f"{like.layout.dtype}")
        except (TypeError, ValueError):
            pass  # raised again below, after the ranks agree on the arguments
    like = _check(like, "fold", {
        "halo": _resolved(like, lambda x: halo_spec(x.layout, width, periodic, corners)),
        "padded": bad or "this rank's padded shard"})
    spec = halo_spec(like.layout, width, periodic, corners)
    if bad:
        raise ValueError(bad)
    return Sharded(_fold(padded, (like.layout, spec, like.mesh)), like.layout, like.mesh)


# ----------------------------------------------------------------------------- FFTs

FFT_KINDS = ("fftn", "ifftn", "rfftn", "irfftn")


def _scipy_pass(a: Any, p: Local) -> bool:
    """Whether a c2c pass runs through ``pyshard_fft`` (scipy.fft in place on XLA's buffer,
    on CPU; ``PYSHARD_JAX_FFT``): complex64/complex128, no resizing, scipy importable."""
    choice = config.get("PYSHARD_JAX_FFT")
    if choice == "jnp" or np.dtype(a.dtype) not in (np.complex64, np.complex128):
        return False
    if any(a.shape[ax] != n for ax, n in zip(p.axes, p.ns)) or tuple(p.ns) != tuple(p.outs):
        return False
    return have_scipy()


def _local_pass(a: Any, p: Local, norm: Optional[str]) -> Any:
    """One local pass of an FFT plan with ``jnp.fft``: the pyshard.fft engine's pass (the
    same dtypes, lengths and resizing)."""
    want = pass_in_dtype(p.func, np.dtype(a.dtype))
    if np.dtype(a.dtype) != want:
        a = a.astype(want)
    shape = list(a.shape)
    for ax, o in zip(p.axes, p.outs):
        shape[ax] = o
    if a.size == 0 or prod(shape) == 0:  # an empty shard: nothing to compute
        return _empty_pass(a, shape, p.dst.dtype)
    if p.func in ("rfft", "irfft"):
        r = getattr(jnp.fft, p.func)(a, n=p.ns[0], axis=p.axes[0], norm=norm)
    elif p.func in ("fftn", "ifftn") and _scipy_pass(a, p):
        r = local_fft(a, p.axes, p.func == "ifftn", norm)
    elif p.func in ("fftn", "ifftn"):
        r = getattr(jnp.fft, p.func)(a, s=p.ns, axes=p.axes, norm=norm)
    else:  # pragma: no cover - the kinds offered have no other pass
        raise NotImplementedError(f"pyshard.jax: no {p.func} pass")
    if tuple(r.shape) != tuple(shape):  # zero-pad or truncate to the pass's output
        sl = tuple(slice(0, min(m, n)) for m, n in zip(r.shape, shape))
        r = jnp.zeros(shape, r.dtype).at[sl].set(r[sl])
    return r.astype(p.dst.dtype)


def _empty_pass(a: Any, shape: Sequence[int], dtype: np.dtype) -> Any:
    """The zeros of ``shape`` that a pass with an empty input or output gives, still a
    function of ``a``: a constant would let ``jax.grad`` drop the backward of every
    redistribute before it on this rank alone (its cotangent unused), while the ranks with
    data run theirs, and wait for this one."""
    tie = jnp.sum(a.reshape(-1)[:0])  # 0, whatever a holds (no inf * 0)
    if jnp.iscomplexobj(tie) and not np.issubdtype(dtype, np.complexfloating):
        tie = jnp.real(tie)
    return jnp.zeros(shape, dtype) + tie.astype(dtype)


def _inexact(x: Sharded, kind: str) -> Sharded:
    """An integer or bool ``x`` as the float dtype ``jnp.fft`` computes it in (float32, or
    float64 under ``jax_enable_x64``), so the plan's dtypes are the local passes' (numpy's
    rules would plan float64 buffers where JAX without x64 gives float32 ones)."""
    dt = np.dtype(x.dtype)
    if dt.kind not in "biu":
        return x
    out = jax.eval_shape(getattr(jnp.fft, kind), jax.ShapeDtypeStruct((2,), dt)).dtype
    ft = np.dtype(jnp.finfo(out).dtype)  # complex64 -> float32
    lay = x.layout
    return Sharded(x.local.astype(ft),
                   Layout(lay.shape, ft, lay.mesh_shape, lay.placements, lay.sizes), x.mesh)


def _fft(kind: str, x: Sharded, s: Optional[Sequence[int]], axes: Optional[Sequence[int]],
         norm: Optional[str], placements: Any, sizes: SizesArg, algorithm: str) -> Sharded:
    x = _check(x, kind, {
        "transform": _resolved(x, lambda x: (lambda f: (f.dst, len(f.passes)))(
            fft_plan(x.layout, kind, axes, s, norm, placements, sizes))),
        "norm": repr("backward" if norm is None else norm), "algorithm": repr(algorithm)})
    x = _inexact(x, kind)
    fp = fft_plan(x.layout, kind, axes, s, norm, placements, sizes)
    local = x.local
    for p in fp.passes:
        if isinstance(p, Local):
            local = _local_pass(local, p, norm)
        elif p.plan.steps:
            gout = grad_out_layout(p.dst, None)
            local = _redistribute(local, (p.src, p.dst, gout, grad_out_scale(p.dst, None),
                                          x.mesh, algorithm))
    return Sharded(local, fp.dst, x.mesh)


def fftn(x: Sharded, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
         norm: Optional[str] = None, placements: Any = None, sizes: SizesArg = None,
         algorithm: str = "auto") -> Sharded:  # fmt: skip
    """``jnp.fft.fftn`` of the global array, inside ``jit`` as outside: ``jnp.fft`` along
    the axes a rank holds whole, redistributes (one exchange each) between, as
    :func:`pyshard.fft.fftn` plans them; ``placements``/``sizes`` the result's layout
    (``None``: the input's, ``"any"``: wherever the last pass ends, the fewest transposes).
    Differentiable (``jnp.fft``'s own VJPs, the redistributes' as :func:`redistribute`)."""
    return _fft("fftn", x, s, axes, norm, placements, sizes, algorithm)


def ifftn(x: Sharded, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
          norm: Optional[str] = None, placements: Any = None, sizes: SizesArg = None,
          algorithm: str = "auto") -> Sharded:  # fmt: skip
    """``jnp.fft.ifftn`` of the global array (see :func:`fftn`)."""
    return _fft("ifftn", x, s, axes, norm, placements, sizes, algorithm)


def rfftn(x: Sharded, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
          norm: Optional[str] = None, placements: Any = None, sizes: SizesArg = None,
          algorithm: str = "auto") -> Sharded:  # fmt: skip
    """``jnp.fft.rfftn`` of the global real array (the last axis first, real to complex;
    see :func:`fftn`)."""
    return _fft("rfftn", x, s, axes, norm, placements, sizes, algorithm)


def irfftn(x: Sharded, s: Optional[Sequence[int]] = None, axes: Optional[Sequence[int]] = None,
           norm: Optional[str] = None, placements: Any = None, sizes: SizesArg = None,
           algorithm: str = "auto") -> Sharded:  # fmt: skip
    """``jnp.fft.irfftn`` of the global array (the last axis last, complex to real; see
    :func:`fftn`)."""
    return _fft("irfftn", x, s, axes, norm, placements, sizes, algorithm)
