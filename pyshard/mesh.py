"""`Mesh`: a Cartesian arrangement of the ranks of an mpi4py communicator."""

from __future__ import annotations

import numbers
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from mpi4py import MPI

from . import _core, _shm, _validate
from ._cache import ExecCache, register
from .collectives import check_finalized

__all__ = ["Mesh"]


def _out_of_comms(e: Exception) -> RuntimeError:
    """A failure to create a mesh's communicators, with what most often causes it."""
    return RuntimeError(
        f"Mesh: creating its communicators failed ({e}); MPI libraries hold a few thousand "
        f"communicators, and a mesh that is dropped keeps its own until MPI finalizes: free "
        f"the meshes a long run no longer needs with Mesh.free()"
    )


class Mesh:
    """A Cartesian mesh over an mpi4py communicator whose size is ``prod(shape)``.

    Creating a mesh is collective over ``comm`` (it calls ``Create_cart``); ranks keep their
    order, and ``coords`` are this rank's coordinates, row-major over ``shape``.
    ``names`` optionally labels the mesh dims (e.g. ``("dp", "tp")``; a 1-D mesh also takes a
    plain string, ``"dp"``, as its one name); a name can be used wherever a mesh dim index is
    taken.
    """

    def __init__(
        self, comm: MPI.Comm, shape: Union[int, Sequence[int]],
        names: Union[str, Sequence[str], None] = None,
    ) -> None:
        if MPI.Is_finalized():
            raise RuntimeError("Mesh: MPI was finalized (MPI.Finalize()): no mesh can be made")
        if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:  # (mpi4py types it Comm,
            # or Intracomm where Split(MPI.UNDEFINED) made it)
            raise ValueError(
                "Mesh(comm): the communicator is MPI.COMM_NULL: a freed one (comm.Free()), "
                "or this rank is not in it (e.g. comm.Split(MPI.UNDEFINED)): only the ranks "
                "of a live communicator build its mesh"
            )
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(
                f"Mesh(comm): expected an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), "
                f"got {type(comm).__name__}"
            )
        if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
            shape = (int(shape),)
        if not isinstance(shape, (tuple, list)) or not shape:
            raise TypeError(f"Mesh(shape): expected a non-empty tuple of ints, got {shape!r}")
        for s in shape:
            if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
                raise ValueError(f"Mesh(shape): every extent must be an int >= 1, got {shape!r}")
        self.shape: Tuple[int, ...] = tuple(int(s) for s in shape)
        if prod(self.shape) != comm.Get_size():
            raise ValueError(
                f"Mesh(shape): prod{self.shape} = {prod(self.shape)} does not match the "
                f"communicator size {comm.Get_size()}"
            )
        default_names = tuple(f"m{i}" for i in range(len(self.shape)))
        if names is None:
            names = default_names
        elif isinstance(names, str):  # one name, never its characters (as shape takes an int)
            if len(self.shape) != 1:
                raise ValueError(
                    f"Mesh(names): need {len(self.shape)} distinct strings, got the single "
                    f"string {names!r} (a string is the one name of a 1-D mesh; name each "
                    f"dim of a {len(self.shape)}-D mesh, e.g. names={default_names!r})"
                )
            names = (names,)
        names = tuple(names)
        if (
            len(names) != len(self.shape)
            or len(set(names)) != len(names)
            or not all(isinstance(n, str) for n in names)
        ):
            raise ValueError(f"Mesh(names): need {len(self.shape)} distinct strings, got {names!r}")
        self.names: Tuple[str, ...] = names
        if _validate.enabled:  # (a rank with another shape ended the job in an MPI error)
            _validate.agree(comm, "Mesh", {"shape": repr(self.shape)})
        self._freed = False  # free() was called: check_live raises
        try:
            self.comm: MPI.Cartcomm = comm.Create_cart(
                dims=list(self.shape), periods=[False] * len(self.shape), reorder=False
            )
        except MPI.Exception as e:
            raise _out_of_comms(e) from e
        self.rank: int = self.comm.Get_rank()
        self.coords: Tuple[int, ...] = tuple(self.comm.Get_coords(self.rank))
        self._subs: Dict[Tuple[int, ...], MPI.Comm] = {}
        self._core_comms: Dict[Tuple[int, ...], _core.Comm] = {}
        # Everything collective is done here, once, so that no data call runs a collective its
        # plan does not name: the communicator over every set of mesh dims (a plan's step runs
        # on one of them) and the core's own duplicate of each, and the node map
        # (pyshard/_shm.py: one MPI_Allgather; each communicator's node-local transport is
        # then made on first use with no MPI call).
        try:
            for k in range(1, 1 << len(self.shape)):
                self.core_comm(tuple(d for d in range(len(self.shape)) if k >> d & 1))
        except (MPI.Exception, RuntimeError) as e:
            raise _out_of_comms(e) from e
        self._node_map: Optional[_shm.NodeMap] = (
            _shm.NodeMap(self.comm, self.shape, self.coords) if self.size > 1 else None
        )
        # executors, the one-lookup fast path and the workspace pool their steps share
        self._cache = register(ExecCache(_core.Workspace()))
        # redistributes in flight (redistribute(wait=False)), oldest first
        self.pending: List[Any] = []

    @property
    def cache(self) -> ExecCache:
        """This mesh's executors, fast-path bindings and workspace pool, as the current
        settings build them (emptied first where a setting changed since: ExecCache.current)."""
        return self._cache.current()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    def _dim(self, dim: object) -> int:
        if isinstance(dim, str):
            if dim not in self.names:
                raise ValueError(f"mesh has no dim named {dim!r}; names are {self.names}")
            return self.names.index(dim)
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"mesh dim must be an int or a name, got {dim!r}")
        d = int(dim) + (self.ndim if dim < 0 else 0)
        if not 0 <= d < self.ndim:
            raise ValueError(f"mesh dim {dim} out of range for a {self.ndim}-D mesh")
        return d

    def sub(self, dim: object) -> MPI.Comm:
        """The sub-communicator along one mesh dim (collective over the mesh on first use).
        The mesh owns it (pyshard uses it too, and :meth:`free` frees it): ``Dup()`` it to
        keep or free one of your own."""
        return self.sub_dims((self._dim(dim),))

    def sub_dims(self, dims: Union[str, Sequence[object]]) -> MPI.Comm:
        """The sub-communicator spanning several mesh dims (ranks row-major over them); a
        plain string is one dim's name, never its characters. The mesh owns it, as
        :meth:`sub`'s; one freed by the caller raises RuntimeError here."""
        if isinstance(dims, str):
            dims = (dims,)
        key = tuple(sorted(self._dim(d) for d in dims))
        c = self._subs.get(key)
        if c is None:
            self.check_live()
            c = self.comm.Sub([d in key for d in range(self.ndim)])
            self._subs[key] = c
        elif c == MPI.COMM_NULL:
            raise RuntimeError(
                f"pyshard: the sub-communicator of mesh dims {key} was freed by the caller; "
                f"Mesh.sub() and sub_dims() return the mesh's own (Dup() it to own one)")
        return c

    def core_comm(self, dims: Tuple[int, ...]) -> _core.Comm:
        """The core's communicator over the mesh dims ``dims`` (sorted), made with the mesh."""
        dims = tuple(sorted(dims))
        c = self._core_comms.get(dims)
        if c is None:
            self.check_live()
            c = _core.Comm(self.sub_dims(dims).py2f())
            self._core_comms[dims] = c
        return c

    def node_transport(self, dims: Tuple[int, ...]) -> Optional[_core.NodeShm]:
        """The node-local transport of the communicator over ``dims`` (pyshard/_shm.py), or
        None where no two of its ranks share a node or it cannot be used (no MPI call)."""
        if self._node_map is None:
            return None
        return self._node_map.transport(self.core_comm(dims), dims)

    def node_info(self) -> Optional[Dict[str, List[int]]]:
        """What the mesh learnt of its ranks' machines when it was built (no MPI call), each a
        list by mesh rank: ``"machine"`` (a key equal exactly for ranks that can share memory:
        one host and boot, one process-id namespace, one user), ``"pid"``, ``"cores"`` (the
        machine's CPU count), ``"shm"`` (1 where the rank could set up node-shared memory),
        ``"world_rank"`` (its rank in MPI_COMM_WORLD); None on a mesh of one rank."""
        return None if self._node_map is None else self._node_map.facts()

    def node_groups(self, dims: Tuple[int, ...]) -> Optional[Dict[int, Tuple[int, int]]]:
        """The node of each rank of this rank's communicator over the mesh dims ``dims``, by
        mesh rank (from the node map the mesh made when it was built, which every rank holds
        alike: no MPI call), or None on a mesh of one rank. Ranks of one node have the same
        value (pyshard/_shm.py ``NodeMap.group``)."""
        if self._node_map is None:
            return None
        m = self._node_map
        return {r: m.group(r) for r in m.members(tuple(self._dim(d) for d in dims))}

    def check_live(self) -> None:
        """RuntimeError if :meth:`free` released this mesh's communicators (before any MPI
        call on them, which would fail with the MPI library's own message)."""
        if self._freed:
            raise RuntimeError(
                f"this mesh was freed (Mesh.free()): {self!r} has no communicators left; "
                f"make a new Mesh"
            )
        check_finalized()

    def free(self) -> None:
        """Release the communicators this mesh created (collective over the mesh).

        Arrays on this mesh cannot be redistributed afterwards, nor the halo arrays and
        gather plans made on it run (each raises RuntimeError). Meshes that are simply
        dropped keep their communicators until MPI finalizes; long-running codes that make
        many meshes should free them. Redistributes still in flight on the mesh
        (``wait=False``, their handles waited for or not) are completed first, in start order.
        Gathers, scatters, migrations and halo updates and folds in flight complete at their
        own ``wait()`` afterwards (their messages were posted before the communicators went).
        """
        if self._freed:  # (again: nothing left to release)
            return
        check_finalized()  # (its communicators went with MPI)
        if self.pending:  # (handles dropped unwaited keep their buffers and requests)
            self.pending[-1].wait()  # (completes every one started before it, in order)
        self._cache.clear()  # executors, and the workspace pool back to the OS
        # migrate's kept buffers and persistent count requests (pyshard.migration.kept)
        self.__dict__.pop("_migrate_state", None)
        if self._node_map is not None:  # node-shared memory: the pools and mappings
            self._node_map.release()
            self._node_map = None
        for c in self._core_comms.values():  # now, though halo arrays, gather plans and
            c.release()  # steps built on the mesh still hold them (they check the mesh)
        self._core_comms.clear()
        for c in self._subs.values():
            if c != MPI.COMM_NULL:  # (one the caller freed itself)
                c.Free()
        self._subs.clear()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
        self._freed = True

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))
        return f"Mesh({dims}; rank {self.rank} at {self.coords})"
