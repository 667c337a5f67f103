"""The gradient convention of the autodiff front ends (pyshard.torch, pyshard.jax; DTensor's,
docs/adjoints.md): how the gradient arriving at a redistribute's result lies, and where the
source's gradient goes. Pure layout arithmetic, no MPI, no torch or jax."""

from __future__ import annotations

from itertools import product
from typing import Any, List, Optional, Sequence, Tuple

from ._cache import memoize
from .layout import Layout, Partial, Placement, Replicate, Shard, SizesArg


def kept_sizes(layout: Layout, placements: Sequence[Placement]) -> SizesArg:
    """``layout``'s extents on every array dim that the same mesh dims shard in
    ``placements`` (the others split balanced)."""
    out = {}
    for d, (mdims, ext, _) in enumerate(layout.table):
        if mdims and tuple(m for m, p in enumerate(placements) if p == Shard(d)) == mdims:
            out[d] = ext
    return out or None



@memoize
def grad_out_layout(result: Layout, grad_placements: Optional[tuple]) -> Layout:
    """How the gradient arriving at ``result`` lies: ``grad_placements``, or the result's
    placements with every Partial read as Replicate."""
    if grad_placements is None:
        pl = [Replicate() if isinstance(p, Partial) else p for p in result.placements]
    else:
        pl = list(grad_placements)
        if len(pl) != len(result.mesh_shape):
            raise ValueError(
                f"grad_placements has {len(pl)} entries, the mesh has {len(result.mesh_shape)} dims"
            )
        for m, p in enumerate(pl):
            if isinstance(p, Partial) and p.op not in ("sum", "avg"):
                raise ValueError(
                    f"grad_placements[{m}] = {p}: a gradient can be Shard, Replicate, "
                    f"Partial('sum') or Partial('avg'), not a {p.op} of the ranks' gradients"
                )
    out = Layout(result.shape, result.dtype, result.mesh_shape, pl, kept_sizes(result, pl))
    if grad_placements is not None:
        bad = _other_local_shape(result, out)
        if bad is not None:
            coords, want, got = bad
            raise ValueError(
                f"grad_placements [{', '.join(map(str, pl))}]: the gradient arriving at the "
                f"result has the result's local shape on every rank ({want} at mesh coords "
                f"{coords}), where these placements give {got}; grad_placements may change how "
                f"ranks combine the gradient (Replicate or Partial), not how it is split"
            )
    return out


@memoize
def _other_local_shape(a: Layout, b: Layout) -> Optional[tuple]:
    """The first mesh coords (with both local shapes) where ``a`` and ``b`` give a rank local
    arrays of different shapes, or None: per array dim, every combination of the mesh dims
    that shard it in either layout (from the shard tables, no communication)."""
    zero = [0] * len(a.mesh_shape)
    for d in range(len(a.shape)):
        mdims = sorted(set(a.table[d][0]) | set(b.table[d][0]))
        for idx in product(*(range(a.mesh_shape[m]) for m in mdims)):
            c = list(zero)
            for m, i in zip(mdims, idx):
                c[m] = i
            ia, ib = a.interval(d, c), b.interval(d, c)
            if ia[1] - ia[0] != ib[1] - ib[0]:
                return tuple(c), a.local_shape(c), b.local_shape(c)
    return None


@memoize
def grad_in_layout(source: Layout) -> Tuple[Layout, int]:
    """Where the gradient of ``source`` goes (its placements, Partial(sum|avg) read as
    Replicate) and the divisor for avg (the number of addends; 1 without avg)."""
    pl: List[Placement] = []
    n = 1
    for m, p in enumerate(source.placements):
        if isinstance(p, Partial):
            if p.op in ("max", "min"):
                raise NotImplementedError(
                    f"pyshard: no gradient through a Partial({p.op!r}) source (mesh dim "
                    f"{m}): max and min are not linear in their addends; reduce it (redistribute "
                    f"to Replicate) outside the graph, or take the framework's own {p.op} "
                    f"(torch's, jax.numpy's) of the reduced value"
                )
            if p.op == "avg":
                n *= source.mesh_shape[m]
            pl.append(Replicate())
        else:
            pl.append(p)
    lay = Layout(source.shape, source.dtype, source.mesh_shape, pl, kept_sizes(source, pl))
    return lay, n


@memoize
def grad_out_scale(result: Layout, grad_placements: Optional[tuple]) -> int:
    """The factor from the gradient arriving at ``result`` to the gradient of its value:
    the number of addends of its ``Partial("avg")`` mesh dims whose gradient is read as
    ``Replicate`` (or ``Shard``), 1 without. A rank's ``Partial("avg")`` tensor is one of n
    addends of the value (their mean), so the gradient with respect to it is the value's
    divided by n (what :func:`grad_in_layout`'s divisor hands a source): the value's is n
    times it. Where ``grad_placements`` makes such a dim ``Partial``, the ranks' gradients
    are combined by that reduction instead, and nothing is scaled."""
    n = 1
    for m, p in enumerate(result.placements):
        if isinstance(p, Partial) and p.op == "avg":
            if grad_placements is None or not isinstance(grad_placements[m], Partial):
                n *= result.mesh_shape[m]
    return n


def scaled(g: Any, mul: int, div: int) -> Any:
    """``g * mul / div`` (a torch tensor or a jax array), untouched where they cancel."""
    if mul == div:
        return g
    if mul != 1:
        g = g * mul
    return g / div if div != 1 else g

