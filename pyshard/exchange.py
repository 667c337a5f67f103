"""The one exchange family: every operation's communication is an :class:`Exchange`, and every
operation in flight a :class:`Request`.

An :class:`Exchange` is one communication pattern of this rank (what it packs for each peer and
where the arrivals go, with counts from layouts every rank holds, or from a count exchange)
bound to one route (node-shared memory, an MPI collective, MPI point-to-point, persistent or
not, direct or staged): the core step that moves its bytes, built once and kept. Its members:

========================  ====================================  ==============================
operation                 exchange                              core step(s)
========================  ====================================  ==============================
``redistribute``          one per collective step of the plan    ``ExchangeStep``,
                          (``pyshard.executor``)                 ``AllgathervStep``, the
                                                                 reductions, their ``Shm*``
``redistribute_many``     one per fused batch                    ``FusedExchangeStep``,
                          (``pyshard.many``)                     ``ShmFusedStep``
halo update and fold      one each per halo array                ``HaloStep``, ``ShmHaloStep``
                          (``pyshard.halo``)
``migrate`` and ``back``  one per call (``pyshard.migration``)   ``MigrateExchange``
``gather`` and            one per gather plan, run forward and   ``IndexExchange``
``scatter`` by index      in reverse (``pyshard.unstructured``)
========================  ====================================  ==============================

Each has the same face: ``op`` (which operation), ``route`` (the path it runs on, chosen by
:mod:`pyshard.route` from what every rank holds alike), ``core`` (the core step), ``need``
(workspace bytes) and :meth:`Exchange.explain`. The FFT engine and the torch functions run
these operations, so they run these exchanges too. A :class:`Request` is an operation in
flight (``redistribute(wait=False)``, ``migrate(wait=False)``, ``back(wait=False)``,
``GatherPlan.gather(wait=False)``): ``test()`` and ``wait()``, as MPI's requests.
"""

from __future__ import annotations

from typing import Any, Dict

from . import config

__all__ = ["NONBLOCKING_MIN_BLOCK", "Exchange", "Request", "default_algorithm"]

NONBLOCKING_MIN_BLOCK = 1 << 20
"""Bytes of the largest block at and above which an exchange's collective is the nonblocking
form (its local copy overlapped); decided from the layouts, so every rank calls the same."""


def default_algorithm() -> str:
    """The algorithm of calls that name none: ``PYSHARD_ALGORITHM`` (pyshard.config)."""
    return config.get("PYSHARD_ALGORITHM")


class Exchange:
    """One communication pattern of this rank bound to one route (see the module doc).

    ``op``: the operation (``"redistribute"``, ``"many"``, ``"halo"``, ``"fold"``,
    ``"migrate"``); ``route``: where it runs (a :class:`pyshard.route.Route`,
    :class:`~pyshard.route.HaloRoute` or :class:`~pyshard.route.MigrateRoute`: ``path``,
    ``algorithm``, ``transport``); ``core``: the core step, built once (None for a step that
    moves nothing between ranks); ``need``: workspace bytes it holds while it runs;
    ``calls``: how many times it has run (see :meth:`comm_stats`); ``sent`` and
    ``received``: the bytes one run sends to and receives from other ranks."""

    __slots__ = ("op", "route", "core", "need", "calls", "sent", "received")

    def __init__(self, op: str, route: Any, core: Any = None, need: int = 0) -> None:
        self.op = op
        self.route = route
        self.core = core
        self.need = need
        self.calls = 0
        self.sent = 0
        self.received = 0

    def runs(self) -> int:
        """How many times this exchange has run on this rank."""
        return self.calls

    def comm_stats(self) -> Dict[str, int]:
        """This exchange's accounting on this rank: ``calls`` (runs), ``bytes_sent`` and
        ``bytes_received`` (to and from other ranks, over every run)."""
        c = self.runs()
        return {"calls": c, "bytes_sent": c * self.sent, "bytes_received": c * self.received}

    @property
    def path(self) -> str:
        """Where the bytes go: ``"shm"`` (node-shared memory), ``"mpi"``, ``"staged"``,
        ``"device"``, ``"local"`` (no peer) or what the route names."""
        return str(getattr(self.route, "path", "local"))

    def explain(self) -> str:
        """One line: the operation, its path, algorithm and MPI transport, the core step and
        its workspace."""
        r = self.route
        alg = getattr(r, "algorithm", None)
        tr = getattr(r, "transport", None)
        core = type(self.core).__name__ if self.core is not None else "none"
        return (f"{self.op}: path {self.path}" + (f", algorithm {alg}" if alg else "")
                + (f", transport {tr}" if tr else "") + f", core {core}, workspace "
                f"{self.need} B")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.explain()}>"


class Request:
    """An operation in flight. :meth:`wait` completes it and returns its result; :meth:`test`
    returns True once it has completed (then :meth:`wait` returns the result at once,
    communicating nothing). Every core exchange on MPI tests its messages with
    ``MPI_Testall`` and never blocks: a redistribute's posted exchange (``Pending``), a halo
    update or fold on an MPI method, ``migrate`` and ``back``, a gather plan's gather and
    scatter (``PendingIndex``). A halo exchange on node-shared memory completes at its first
    :meth:`test` as :meth:`wait` does (waiting for its node peers)."""

    __slots__ = ()

    def wait(self) -> Any:  # pragma: no cover - each kind of request its own
        raise NotImplementedError

    @property
    def done(self) -> bool:  # pragma: no cover - each kind of request its own
        raise NotImplementedError

    def test(self) -> bool:
        """True when the operation has completed (see the class doc)."""
        if not self.done:
            self.wait()
        return True
