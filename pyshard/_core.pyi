"""Type stubs for the compiled core (cpp/bindings.cpp)."""

import enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, overload

import numpy as np

__version__: str
large_count: bool
built_with: str
built_with_compiler: str
max_dims: int

class Algorithm(enum.Enum):
    alltoallv = 0
    alltoall = 1
    p2p = 2
    alltoallw = 3

class ReduceOp(enum.Enum):
    sum = 0
    max = 1
    min = 2
    lor = 3
    land = 4

class Mem(enum.Enum):
    host = 0
    cuda = 1

class Transport(enum.Enum):
    direct = 0
    staged = 1

class Comm:
    def __init__(self, fortran_handle: int) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def rank(self) -> int: ...

class Workspace:
    def __init__(self) -> None: ...
    def trim(self, keep: int) -> None: ...
    def release(self) -> None: ...
    @property
    def held(self) -> int: ...

_Shape = Sequence[int]
_Block = Tuple[int, _Shape, _Shape]  # (peer, start, extent)
_Box = Tuple[_Shape, _Shape]  # (start, extent)

class _Geometry:
    @property
    def workspace_bytes(self) -> int: ...
    @property
    def staged_bytes(self) -> int: ...

class ExchangeGeometry(_Geometry):
    packs: bool
    unpacks: bool
    algorithm: Algorithm
    descriptors: int
    def __init__(
        self,
        size: int,
        itemsize: int,
        src_shape: _Shape,
        dst_shape: _Shape,
        sends: Sequence[_Block],
        recvs: Sequence[_Block],
        local: Sequence[Tuple[_Shape, _Shape, _Shape]],
        algorithm: Algorithm = ...,
        pad_bytes: int = 0,
    ) -> None: ...

class GatherGeometry(_Geometry):
    unpacks: bool
    def __init__(
        self, size: int, rank: int, itemsize: int, src_shape: _Shape, dst_shape: _Shape,
        recvs: Sequence[_Box],
    ) -> None: ...

class ScatterGeometry(_Geometry):
    packs: bool
    def __init__(
        self, size: int, rank: int, itemsize: int, src_shape: _Shape, dst_shape: _Shape,
        pieces: Sequence[_Box],
    ) -> None: ...

class _Step:
    """A collective step, built with the transport it runs on for its whole life (the one
    its route chose: ``pyshard.route.Route.transport``)."""
    def run(self, src: np.ndarray, dst: np.ndarray) -> None: ...
    def run_device(self, src: int, dst: int, stream: int) -> None: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def workspace_bytes(self) -> int: ...
    @property
    def staged_bytes(self) -> int: ...

class PendingExchange:
    def __init__(self) -> None: ...
    active: bool

class ExchangeStep(_Step):
    def __init__(
        self, comm: Comm, geometry: ExchangeGeometry, workspace: Workspace,
        transport: Transport, nonblocking: bool = False,
    ) -> None: ...
    def start(self, src: np.ndarray, dst: np.ndarray, pending: PendingExchange) -> None: ...
    def complete(self, pending: PendingExchange) -> None: ...
    def start_device(self, src: int, dst: int, stream: int, pending: PendingExchange) -> None: ...
    def complete_device(self, pending: PendingExchange, stream: int) -> None: ...
    @property
    def algorithm(self) -> Algorithm: ...
    @property
    def packs(self) -> bool: ...
    @property
    def unpacks(self) -> bool: ...

class AllgathervStep(_Step):
    def __init__(
        self, comm: Comm, geometry: GatherGeometry, workspace: Workspace, transport: Transport
    ) -> None: ...
    @property
    def unpacks(self) -> bool: ...

class _Bound:
    """A host step that runs straight into its output, bound to its result's dtype and
    shape: ``ShardedArray.redistribute``'s fast path (``pyshard.executor.bind``)."""
    def __call__(self, src: np.ndarray, out: Optional[np.ndarray]) -> Optional[np.ndarray]: ...
    @property
    def fn(self) -> Callable[[np.ndarray, Optional[np.ndarray]], Optional[np.ndarray]]:
        """The same call as a builtin function (METH_FASTCALL, no pybind11 dispatch)."""
    @property
    def calls(self) -> int: ...

class BoundExchange(_Bound):
    def __init__(self, step: ExchangeStep, dtype: np.dtype, pooled: bool) -> None: ...

class BoundAllgatherv(_Bound):
    def __init__(self, step: AllgathervStep, dtype: np.dtype, pooled: bool) -> None: ...

class AllreduceStep(_Step):
    def __init__(
        self, comm: Comm, dtype: np.dtype, op: ReduceOp, shape: _Shape, workspace: Workspace,
        transport: Transport,
    ) -> None: ...

class ReduceScatterStep(_Step):
    def __init__(
        self, comm: Comm, geometry: ScatterGeometry, dtype: np.dtype, op: ReduceOp,
        workspace: Workspace, transport: Transport,
    ) -> None: ...
    @property
    def packs(self) -> bool: ...

class HaloMethod(enum.Enum):
    persistent = 0
    p2p = 1
    datatype = 2
    neighbor = 3

_BoxSpec = Tuple[_Shape, _Shape]

class HaloGeometry:
    def __init__(
        self, itemsize: int, shape: _Shape,
        sends: Sequence[Tuple[int, Sequence[_BoxSpec]]],
        recvs: Sequence[Tuple[int, Sequence[_BoxSpec]]],
        local: Sequence[Tuple[_Shape, _Shape, _Shape]],
        reverse: bool = False, local_at: int = 0,
    ) -> None: ...
    send_bytes: int
    recv_bytes: int
    local_bytes: int
    reverse: bool
    local_at: int
    @property
    def recv_offsets(self) -> List[int]: ...
    @property
    def descriptors(self) -> int: ...

class HaloStep:
    def __init__(
        self, comm: Comm, geometry: HaloGeometry, method: HaloMethod, tag: int,
        transport: Transport,
    ) -> None: ...
    def start(self, padded: np.ndarray) -> None: ...
    def wait(self, padded: np.ndarray) -> None: ...
    def update(self, padded: np.ndarray) -> None: ...
    def fold_wait(self, padded: np.ndarray, op: int, kind: int) -> None: ...
    def fold(self, padded: np.ndarray, op: int, kind: int) -> None: ...
    @property
    def buffer(self) -> int: ...
    def start_device(self, ptr: int, stream: int) -> None: ...
    def wait_device(self, ptr: int, stream: int) -> None: ...
    @property
    def active(self) -> bool: ...
    @property
    def method(self) -> HaloMethod: ...
    @property
    def transport(self) -> Transport: ...

class HaloBuffer:
    """A halo array's padded block in node-shared memory (buffer protocol: its bytes)."""
    def __init__(self, node: Any, nbytes: int) -> None: ...  # node: a NodeShm
    @property
    def nbytes(self) -> int: ...

# a node peer's share: (its rank, its padded shape, [(start here, start there, extent)])
_HaloPeer = Tuple[int, _Shape, Sequence[Tuple[_Shape, _Shape, _Shape]]]

class ShmHaloStep:
    """A halo update (or, reverse, a fold) through node-shared memory (cpp/shm_halo.h)."""
    def __init__(
        self, comm: Comm, buffer: HaloBuffer, mpi: HaloGeometry, tag: int,
        peers: Sequence[_HaloPeer], waiters: int, reverse: bool = False,
        order: Sequence[Tuple[int, int]] = (),
        wraps: Sequence[Tuple[_Shape, _Shape, _Shape]] = (),
    ) -> None: ...
    def start(self, padded: np.ndarray) -> None: ...
    def wait(self, padded: np.ndarray) -> None: ...
    def update(self, padded: np.ndarray) -> None: ...
    def fold_wait(self, padded: np.ndarray, op: int, kind: int) -> None: ...
    def fold(self, padded: np.ndarray, op: int, kind: int) -> None: ...
    @property
    def active(self) -> bool: ...
    @property
    def node_peers(self) -> int: ...
    @property
    def waiters(self) -> int: ...
    @property
    def mpi_peers(self) -> int: ...

def migrate_count(dest: np.ndarray, P: int) -> Tuple[np.ndarray, int]: ...
def migrate_counts(
    comm: Comm, algorithm: int, counts: np.ndarray, code: int, sig: int
) -> Tuple[np.ndarray, int, bool, int]: ...

class MigratePeers:
    def __init__(self, comm: Comm, peers: List[int]) -> None: ...
    def exchange(
        self, counts: np.ndarray, code: int, sig: int
    ) -> Tuple[np.ndarray, int, bool, int]: ...
    @property
    def peers(self) -> List[int]: ...

class MigrateExchange:
    def __init__(self, comm: Comm, node: Any = None) -> None: ...  # node: a NodeShm
    def start_forward(
        self, dest: np.ndarray, cnt: np.ndarray, rcnt: np.ndarray, src: List[np.ndarray],
        dst: List[np.ndarray], row_off: np.ndarray, send: np.ndarray, recv: np.ndarray,
        block: Optional[np.ndarray] = None,
    ) -> None: ...
    def table_bytes(self, back: bool, columns: int) -> int: ...
    def start_back(
        self, dest: np.ndarray, cnt: np.ndarray, rcnt: np.ndarray, src: List[np.ndarray],
        dst: List[np.ndarray], row_off: np.ndarray, send: np.ndarray, recv: np.ndarray,
        sig: int,
    ) -> None: ...
    def back_error(
        self, cnt: np.ndarray, rcnt: np.ndarray, sig: int, code: int,
        recv: Optional[np.ndarray] = None,
    ) -> None: ...
    def wait(self) -> None: ...
    @property
    def active(self) -> bool: ...

def halo_copy_local(geometry: HaloGeometry, src: np.ndarray, dst: np.ndarray) -> None: ...
def allgather_i64(comm: Comm, values: Sequence[int]) -> List[int]: ...
def stream_copy(src: np.ndarray, dst: np.ndarray) -> None: ...
def copy_box(
    src: np.ndarray, src_start: _Shape, dst: np.ndarray, dst_start: _Shape, extent: _Shape,
    offsets: bool = False,
) -> None: ...
# (src_shape, src_start, dst_shape, dst_start, extent) or the same plus (src_base, dst_base)
_KernelBox = Union[
    Tuple[_Shape, _Shape, _Shape, _Shape, _Shape],
    Tuple[_Shape, _Shape, _Shape, _Shape, _Shape, int, int],
]

@overload
def copy_kernel_on_host(
    geometry: Union[ExchangeGeometry, GatherGeometry, ScatterGeometry],
    table: str,
    src: np.ndarray,
    dst: np.ndarray,
    b0: int = 0,
    b1: Optional[int] = None,
    src_offset: int = 0,
    dst_offset: int = 0,
    kernel: bool = True,
) -> Optional[Dict[str, Any]]: ...
@overload
def copy_kernel_on_host(
    blocks: Sequence[Sequence[_KernelBox]],
    itemsize: int,
    src: np.ndarray,
    dst: np.ndarray,
    b0: int = 0,
    b1: Optional[int] = None,
    src_offset: int = 0,
    dst_offset: int = 0,
    kernel: bool = True,
) -> Optional[Dict[str, Any]]: ...
def device_pack(geometry: ExchangeGeometry, src: int, dst: int, stream: int = 0) -> None: ...
def stats() -> Dict[str, int]: ...
def reset_stats() -> None: ...
def library_version() -> str: ...
def library_standard() -> Tuple[int, int]: ...
def large_count_method() -> str: ...
def large_count_reduce_method() -> str: ...
def count_limit() -> int: ...
def large_count_stats() -> Dict[str, int]: ...
def reset_large_count_stats() -> None: ...
def peer_timeout() -> float: ...
def set_peer_timeout(seconds: float) -> None: ...
def set_count_limit(n: int) -> None: ...
def library_path() -> str: ...
def cuda_built() -> bool: ...
def cuda_build_version() -> int: ...
def cuda_device_present() -> bool: ...
def cuda_aware_mpi() -> int: ...
