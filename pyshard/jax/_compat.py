"""Every JAX name pyshard.jax uses that is private or moves between JAX releases, in one place.

Tested with jax and jaxlib 0.10.x (``pip install .[jax]`` pins them). Outside that range
importing pyshard.jax raises ImportError naming the versions, rather than failing later in a
lowering rule. What is private here:

- the ordered effect: a class registered in ``jax._src.effects``' sets (lowerable, ordered,
  allowed in control flow, custom derivatives and remat), as mpi4jax registers its own;
- ``jax._src.core.abstract_token``, the token's abstract value (public again from 0.11);
- ``jax._src.dispatch.apply_primitive``, a primitive's eager implementation;
- ``jax._src.ad_checkpoint._insert_reduce_precision``, wrapped so that ``jax.checkpoint``
  (remat) takes complex residuals (below).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import jax

from .. import config

TESTED = ((0, 10), (0, 11))  # jax versions in [lo, hi)


def _version(v: str) -> tuple:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


JAX_VERSION = _version(jax.__version__)
UNTESTED = not (TESTED[0] <= JAX_VERSION[:2] < TESTED[1])
if UNTESTED and not config.get("PYSHARD_JAX_UNTESTED"):
    raise ImportError(
        f"pyshard.jax works with jax 0.10.x (it uses JAX's private effect and token API, which "
        f"moves between releases); this is jax {jax.__version__}: "
        f"pip install 'jax[cpu]>=0.10,<0.11' (or set PYSHARD_JAX_UNTESTED=1 to try it anyway)"
    )
if UNTESTED:
    logging.getLogger("pyshard.jax").warning(
        "jax %s is outside the tested 0.10.x; going on because PYSHARD_JAX_UNTESTED is set",
        jax.__version__)

from jax._src import effects as _effects  # noqa: E402
from jax._src.core import abstract_token  # noqa: E402,F401
from jax._src.dispatch import apply_primitive  # noqa: E402,F401
from jax.extend.core import Primitive  # noqa: E402,F401
from jax.interpreters.mlir import TokenSet  # noqa: E402

_EFFECT_HASH = int(hashlib.md5(b"pyshard.jax ordered MPI effect").hexdigest()[:15], 16)


class PyshardEffect(_effects.Effect):
    """The ordered effect of every pyshard.jax call that communicates: XLA runs them one at a
    time, in program order, on every rank."""

    def __hash__(self) -> int:  # the same in every process: part of the compiled program
        return _EFFECT_HASH

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PyshardEffect)

    def __repr__(self) -> str:
        return "PyshardEffect"


for _set in (_effects.lowerable_effects, _effects.ordered_effects,
             _effects.control_flow_allowed_effects,
             _effects.custom_derivatives_allowed_effects, _effects.remat_allowed_effects):
    _set.add_type(PyshardEffect)

effect = PyshardEffect()


def token_in(ctx: Any) -> Any:
    """The ordering token entering a lowering."""
    return ctx.tokens_in.get(effect)


def set_token_out(ctx: Any, token: Any) -> None:
    """The ordering token leaving a lowering."""
    ctx.set_tokens_out(TokenSet({effect: token}))


# jax.checkpoint (remat) saves the result of every pyshard step (an effect: never recomputed)
# as a residual, and JAX 0.10 then puts reduce_precision on each saved float residual, which
# refuses complex dtypes ("reduce_precision does not accept dtype complex128": the same error
# pure JAX gives for complex residuals under policy=everything_saveable). So a remat over any
# complex redistribute, every distributed FFT, failed. The wrapper leaves complex residuals
# out of that pass (they need no rounding: XLA's excess precision concerns real floats) and
# hands the others to JAX's own.
from jax._src import ad_checkpoint as _ad_checkpoint  # noqa: E402

_reduce_precision_pass = _ad_checkpoint._insert_reduce_precision


def _is_complex(v: Any) -> bool:
    dt = getattr(getattr(v, "aval", None), "dtype", None)
    try:
        return dt is not None and jax.numpy.issubdtype(dt, jax.numpy.complexfloating)
    except TypeError:  # an extended dtype (a key, a token): not complex
        return False


def _insert_reduce_precision(jaxpr: Any, num_res: int) -> Any:
    outs = list(jaxpr.outvars)
    keep, res = outs[:len(outs) - num_res], outs[len(outs) - num_res:]
    cplx = [v for v in res if _is_complex(v)]
    if not cplx:
        return _reduce_precision_pass(jaxpr, num_res)
    real = [v for v in res if not _is_complex(v)]
    # JAX's pass reads the residuals as the last num_res outputs and keeps every output
    # variable as it is (it renames the producers' variables): reorder, run, restore
    done = _reduce_precision_pass(jaxpr.replace(outvars=keep + cplx + real), len(real))
    return done.replace(outvars=outs)


_insert_reduce_precision._pyshard = True  # type: ignore[attr-defined]
if getattr(_reduce_precision_pass, "_pyshard", False):  # (pyshard.jax imported anew)
    _reduce_precision_pass = _reduce_precision_pass.__wrapped__  # type: ignore[attr-defined]
_insert_reduce_precision.__wrapped__ = _reduce_precision_pass  # type: ignore[attr-defined]
_ad_checkpoint._insert_reduce_precision = _insert_reduce_precision
