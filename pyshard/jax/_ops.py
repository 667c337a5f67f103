"""pyshard.jax's primitives: one collective step of a redistribute plan (``pyshard_step``) and
one halo exchange, update or fold, of a padded array (``pyshard_halo``).

Each lowers to the XLA FFI custom call ``pyshard_step`` (cpp/bindings_jax.cpp) whose one
attribute is the id of a core step registered here at lowering time: the same core step
objects (ExchangeStep, AllgathervStep, AllreduceStep, ReduceScatterStep, HaloStep) that the
numpy path builds from the same plans. Every call threads the ordered effect's token
(_compat), so XLA runs pyshard's collectives one at a time in program order on every rank.
Outside ``jit`` a primitive runs eagerly (compiled on its own, as JAX does).

An XLA buffer is not in node-shared memory, so node peers cannot write into it: an exchange
on host buffers that the route sends through node-shared memory lands the node peers' blocks
in a segment of the receiver's and copies them over (this rank's own blocks and those from
other nodes go straight into XLA's buffer); every other step takes MPI (:func:`step_route`).
On the CPU platform the steps run on host
buffers; on the CUDA platform (a core built with CUDA) the same custom call runs them on XLA's
device buffers with the core's pack kernels on XLA's stream, built on the GPU route (staged
through host memory, or CUDA-aware MPI), as cupy arrays run; experimental, so only where
PYSHARD_JAX_CUDA is on (docs/jax.md: what its first GPU run showed). A halo fold on a GPU
combines with the core's combine kernel, one launch a box in the fold's order (the host
fold's bits; the kernel's body is tested on the host, tests/test_kernels_on_host.py).
"""

from __future__ import annotations

from math import prod
from typing import Any, Dict, Tuple

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.ffi import ffi_lowering, register_ffi_target
from jax.interpreters import ad, batching, mlir

from .. import _core, config
from ..executor import step_executor
from ..halo import mpi_exchange
from ..halo_planner import HaloSpec, halo_plan
from ..layout import Layout, Shard
from ..mesh import Mesh
from ..planner import Step
from ..route import FOLD_KIND, choose_algorithm, route
from ._compat import Primitive, abstract_token, apply_primitive, effect, set_token_out, token_in

TARGET = "pyshard_step"
register_ffi_target(TARGET, _core.jax_handler(), platform="cpu")
# (a jaxlib without CUDA only queues this registration)
register_ffi_target(TARGET, _core.jax_cuda_handler(), platform="CUDA")

# (what the step is) -> (the executor or core step kept alive, its id in the core)
_registered: Dict[tuple, Tuple[Any, int]] = {}


def registered() -> int:
    """How many core steps pyshard.jax has registered in this process."""
    return len(_registered)


def mpi_algorithm(step: Step, algorithm: str) -> str:
    """The MPI algorithm of an exchange step under ``algorithm`` (``auto``: the route's MPI
    rule, from the layouts alone)."""
    return choose_algorithm(step, algorithm, False) if step.kind == "alltoallv" else "alltoallv"


def step_route(step: Step, mesh: Mesh, algorithm: str, device: bool = False) -> Any:
    """The route of a step under pyshard.jax. An exchange on host buffers under ``auto`` (or
    ``shm``) takes node-shared memory where the numpy route would: node peers write their
    blocks into a segment of the receiver's, copied over into XLA's buffer, and this rank's
    own blocks and those from other nodes go straight into it. Every other step takes MPI
    (:func:`mpi_algorithm`)."""
    if not device and step.kind == "alltoallv" and algorithm in ("auto", "shm"):
        r = route(step, mesh, algorithm, device)
        if r.path == "shm":
            return r
    return route(step, mesh, mpi_algorithm(step, algorithm), device)


def _step_id(step: Step, mesh: Mesh, algorithm: str, device: bool = False) -> int:
    key = ("step", step.kind, step.mesh_dims, step.src, step.dst, step.op, mesh, algorithm,
           device)
    hit = _registered.get(key)
    if hit is None:
        e = step_executor(step, mesh, step_route(step, mesh, algorithm, device), device)
        dt = e.upcast if e.upcast is not None else step.src.dtype
        sb = prod(step.src.local_shape(mesh.coords)) * dt.itemsize
        db = prod(e.out_shape) * dt.itemsize
        hit = (e, int(_core.jax_register_step(e.core, sb, db, device,
                                              mesh.core_comm(step.mesh_dims))))
        _registered[key] = hit
    return hit[1]


def _halo_id(layout: Layout, spec: HaloSpec, mesh: Mesh, fold: bool, kind: int,
             device: bool = False) -> int:  # fmt: skip
    key = ("halo", layout, spec, mesh, fold, kind, device)
    hit = _registered.get(key)
    if hit is None:
        p = halo_plan(layout, spec, mesh.coords)
        # p2p: no requests bound to one address (XLA's buffers move between calls)
        core = mpi_exchange(layout, spec, mesh, "p2p", fold, device).core
        nbytes = prod(p.padded_shape) * layout.dtype.itemsize
        comm = mesh.core_comm(tuple(range(mesh.ndim)))  # (the halo's, as mpi_exchange's)
        hit = (core, int(_core.jax_register_halo(core, nbytes, fold, 0, kind, device, comm)))
        _registered[key] = hit
    return hit[1]


def _lower_call(ctx: Any, x: Any, sid: int, alias: bool) -> list:
    tok = token_in(ctx)
    ctx2 = ctx.replace(avals_in=(*ctx.avals_in, abstract_token),
                       avals_out=(*ctx.avals_out, abstract_token))
    extra = {"operand_output_aliases": {0: 0}} if alias else {}
    out, tok = ffi_lowering(TARGET, has_side_effect=True, **extra)(ctx2, x, tok,
                                                                   step=np.int64(sid))
    set_token_out(ctx, tok)
    return [out]


def _platforms(ctx: Any) -> str:
    return ", ".join(getattr(ctx.module_context, "platforms", ()) or ("?",))


def _unsupported(name: str) -> Any:
    """A lowering for platforms other than CPU and CUDA: a clear error instead of JAX's "no
    MLIR translation rule"."""

    def lower(ctx: Any, *args: Any, **params: Any) -> list:
        raise NotImplementedError(
            f"pyshard.jax: {name} runs on CPU and CUDA devices only; this program is lowered "
            f"for {_platforms(ctx)}. Keep the local arrays on a CPU device "
            f"(jax.device_put(x, jax.devices('cpu')[0])) or run with JAX_PLATFORMS=cpu")

    return lower


def _cuda_core(ctx: Any, name: str) -> None:
    """NotImplementedError unless the core was built with CUDA and PYSHARD_JAX_CUDA is on
    (the CUDA registration is experimental: docs/jax.md)."""
    if not config.get("PYSHARD_JAX_CUDA"):
        raise NotImplementedError(
            f"pyshard.jax: {name} on a GPU is experimental and off: its GPU runs "
            f"(2026-12-04/05) gave wrong results on some ranks, and the fix has not run on a "
            f"GPU yet (docs/jax.md). "
            f"Set PYSHARD_JAX_CUDA=1 to try it; this program is lowered for "
            f"{_platforms(ctx)}. Or keep the local arrays on a CPU device "
            f"(jax.device_put(x, jax.devices('cpu')[0])) or run with JAX_PLATFORMS=cpu")
    if _core.cuda_build_version() < 0:
        raise NotImplementedError(
            f"pyshard.jax: {name} on a GPU needs pyshard's core built with CUDA (this one is "
            f"not: PYSHARD_CUDA=ON bash scripts/setup.sh); this program is lowered for "
            f"{_platforms(ctx)}. Or keep the local arrays on a CPU device "
            f"(jax.device_put(x, jax.devices('cpu')[0])) or run with JAX_PLATFORMS=cpu")


def batched(layout: Layout, n: int) -> Layout:
    """``layout`` with a leading, unsharded dim of ``n`` (vmap's batch dim)."""
    pl = [Shard(p.dim + 1) if isinstance(p, Shard) else p for p in layout.placements]
    sizes = {d + 1: ext for d, (mdims, ext, _) in enumerate(layout.table) if mdims}
    return Layout((n, *layout.shape), layout.dtype, layout.mesh_shape, pl, sizes or None)


# ----------------------------------------------------------------------------- step


step_p = Primitive("pyshard_step")
step_p.def_impl(lambda *a, **k: apply_primitive(step_p, *a, **k))


def _step_abstract(x: Any, *, step: Step, mesh: Mesh, algorithm: str, shape: tuple,
                   dtype: np.dtype) -> Any:  # fmt: skip
    return ShapedArray(shape, dtype), {effect}


def _step_lower(ctx: Any, x: Any, *, step: Step, mesh: Mesh, algorithm: str, shape: tuple,
                dtype: np.dtype) -> list:  # fmt: skip
    return _lower_call(ctx, x, _step_id(step, mesh, algorithm), False)


def _step_lower_cuda(ctx: Any, x: Any, *, step: Step, mesh: Mesh, algorithm: str,
                     shape: tuple, dtype: np.dtype) -> list:  # fmt: skip
    _cuda_core(ctx, "a redistribute's collective step")
    return _lower_call(ctx, x, _step_id(step, mesh, algorithm, True), False)


def _step_batch(args: tuple, dims: tuple, *, step: Step, mesh: Mesh, algorithm: str,
                shape: tuple, dtype: np.dtype) -> Tuple[Any, int]:  # fmt: skip
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0) if d != 0 else x
    n = x.shape[0]
    b = Step(step.kind, step.mesh_dims, batched(step.src, n), batched(step.dst, n), step.op)
    return step_p.bind(x, step=b, mesh=mesh, algorithm=algorithm, shape=(n, *shape),
                       dtype=dtype), 0


step_p.def_effectful_abstract_eval(_step_abstract)
mlir.register_lowering(step_p, _unsupported("a redistribute's collective step"))
mlir.register_lowering(step_p, _step_lower, platform="cpu")
mlir.register_lowering(step_p, _step_lower_cuda, platform="cuda")
batching.primitive_batchers[step_p] = _step_batch


def run_step(x: Any, step: Step, mesh: Mesh, algorithm: str, shape: tuple) -> Any:
    """One collective step of a plan on this rank's array ``x`` (already in the dtype the
    step runs in): the result, of ``shape``."""
    return step_p.bind(x, step=step, mesh=mesh, algorithm=algorithm, shape=tuple(shape),
                       dtype=np.dtype(x.dtype))


# ----------------------------------------------------------------------------- halo


halo_p = Primitive("pyshard_halo")
halo_p.def_impl(lambda *a, **k: apply_primitive(halo_p, *a, **k))


def _halo_abstract(x: Any, *, layout: Layout, spec: HaloSpec, mesh: Mesh, fold: bool) -> Any:
    return ShapedArray(x.shape, x.dtype), {effect}


def _halo_lower(ctx: Any, x: Any, *, layout: Layout, spec: HaloSpec, mesh: Mesh,
                fold: bool) -> list:  # fmt: skip
    kind = FOLD_KIND[np.dtype(layout.dtype)] if fold else -1
    return _lower_call(ctx, x, _halo_id(layout, spec, mesh, fold, kind), True)


def _halo_lower_cuda(ctx: Any, x: Any, *, layout: Layout, spec: HaloSpec, mesh: Mesh,
                     fold: bool) -> list:  # fmt: skip
    name = "a halo fold (the gradient of halo_pad)" if fold else "a halo update"
    _cuda_core(ctx, name)
    # a fold combines on the device (the core's combine kernel, one launch a box in the
    # fold's order: cpp/device_fold.h)
    kind = FOLD_KIND[np.dtype(layout.dtype)] if fold else -1
    return _lower_call(ctx, x, _halo_id(layout, spec, mesh, fold, kind, True), True)


def _halo_batch(args: tuple, dims: tuple, *, layout: Layout, spec: HaloSpec, mesh: Mesh,
                fold: bool) -> Tuple[Any, int]:  # fmt: skip
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0) if d != 0 else x
    b = HaloSpec((0, *spec.width), (False, *spec.periodic), spec.corners)
    return halo_p.bind(x, layout=batched(layout, x.shape[0]), spec=b, mesh=mesh, fold=fold), 0


halo_p.def_effectful_abstract_eval(_halo_abstract)
mlir.register_lowering(halo_p, _unsupported("a halo update or fold"))
mlir.register_lowering(halo_p, _halo_lower, platform="cpu")
mlir.register_lowering(halo_p, _halo_lower_cuda, platform="cuda")
batching.primitive_batchers[halo_p] = _halo_batch


def run_halo(padded: Any, layout: Layout, spec: HaloSpec, mesh: Mesh, fold: bool) -> Any:
    """A halo update (the ghost cells filled from their owners) or fold (every ghost cell
    summed into its owner's cell) of this rank's padded array."""
    return halo_p.bind(padded, layout=layout, spec=spec, mesh=mesh, fold=fold)


# ----------------------------------------------------------------------------- local FFT

FFT_TARGET = "pyshard_fft"
register_ffi_target(FFT_TARGET, _core.jax_fft_handler(), platform="cpu")
NORMS = ("backward", "ortho", "forward")


def _fft_in_place(a: np.ndarray, axes: tuple, inverse: bool, norm: int) -> None:
    """pyshard_fft's Python side: ``a`` (a view of XLA's buffer) transformed in place by
    scipy.fft (pocketfft transforms a complex array in place where told it may)."""
    import scipy.fft as sfft

    f = sfft.ifftn if inverse else sfft.fftn
    r = f(a, axes=axes, norm=NORMS[norm], overwrite_x=True)
    if r.ctypes.data != a.ctypes.data:  # (not in place after all: copy it in)
        a[...] = r


_core.jax_set_fft_function(_fft_in_place)

fft_p = Primitive("pyshard_fft")
fft_p.def_impl(lambda *a, **k: apply_primitive(fft_p, *a, **k))
fft_p.def_abstract_eval(lambda x, *, axes, inverse, norm: ShapedArray(x.shape, x.dtype))


def _fft_lower_cpu(ctx: Any, x: Any, *, axes: tuple, inverse: bool, norm: int) -> list:
    # the result takes the source's buffer (XLA copies the source first where it is still
    # needed), so the pass runs in place with no result page faulted in
    return ffi_lowering(FFT_TARGET, operand_output_aliases={0: 0})(
        ctx, x, axes=np.asarray(axes, np.int64), inverse=np.int64(inverse), norm=np.int64(norm))


def _fft_jnp(x: Any, *, axes: tuple, inverse: bool, norm: int) -> Any:
    f = jnp.fft.ifftn if inverse else jnp.fft.fftn
    return f(x, axes=axes, norm=NORMS[norm])


def _fft_batch(args: tuple, dims: tuple, *, axes: tuple, inverse: bool,
               norm: int) -> Tuple[Any, int]:  # fmt: skip
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0) if d != 0 else x
    return fft_p.bind(x, axes=tuple(a + 1 for a in axes), inverse=inverse, norm=norm), 0


def _fft_transpose(ct: Any, x: Any, *, axes: tuple, inverse: bool, norm: int) -> list:
    # the DFT matrix is symmetric: the transpose of a pass is the same pass (as lax.fft's rule)
    return [fft_p.bind(ct, axes=axes, inverse=inverse, norm=norm)]


mlir.register_lowering(fft_p, mlir.lower_fun(_fft_jnp, multiple_results=False))
mlir.register_lowering(fft_p, _fft_lower_cpu, platform="cpu")
batching.primitive_batchers[fft_p] = _fft_batch
ad.deflinear2(fft_p, _fft_transpose)


def local_fft(x: Any, axes: tuple, inverse: bool, norm: Any) -> Any:
    """``jnp.fft.fftn`` (``ifftn`` where ``inverse``) of ``x`` along ``axes`` with no resizing,
    for complex64 and complex128: on CPU through scipy.fft in place on XLA's buffer (the
    ``pyshard_fft`` custom call), elsewhere ``jnp.fft``. Linear: its transpose is itself."""
    code = NORMS.index(norm if norm is not None else "backward")
    return fft_p.bind(x, axes=tuple(int(a) for a in axes), inverse=bool(inverse), norm=code)
