"""Type stubs for the compiled core (cpp/core.cpp)."""

from typing import Dict, List, Sequence, Tuple

import numpy as np

__version__: str
large_count: bool
built_with: str

class Comm:
    def __init__(self, fortran_handle: int) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def rank(self) -> int: ...

_Block = Tuple[int, Sequence[int], Sequence[int]]

class AlltoallvStep:
    def __init__(
        self,
        comm: Comm,
        itemsize: int,
        src_shape: Sequence[int],
        dst_shape: Sequence[int],
        sends: Sequence[_Block],
        recvs: Sequence[_Block],
        local: Sequence[Tuple[Sequence[int], Sequence[int], Sequence[int]]],
        algorithm: int = 0,
        pad_bytes: int = 0,
        nonblocking: bool = False,
    ) -> None: ...
    def run(self, src: np.ndarray, dst: np.ndarray) -> None: ...
    @property
    def packs(self) -> bool: ...
    @property
    def unpacks(self) -> bool: ...
    @property
    def algorithm(self) -> int: ...
    @property
    def workspace_bytes(self) -> int: ...

class AllgathervStep:
    def __init__(
        self,
        comm: Comm,
        itemsize: int,
        src_shape: Sequence[int],
        dst_shape: Sequence[int],
        recvs: Sequence[Tuple[Sequence[int], Sequence[int]]],
    ) -> None: ...
    def run(self, src: np.ndarray, dst: np.ndarray) -> None: ...
    @property
    def unpacks(self) -> bool: ...
    @property
    def workspace_bytes(self) -> int: ...

class AllreduceStep:
    def __init__(self, comm: Comm, type: str, op: str, shape: Sequence[int]) -> None: ...
    def run(self, src: np.ndarray, dst: np.ndarray) -> None: ...

class ReduceScatterStep:
    def __init__(
        self,
        comm: Comm,
        type: str,
        op: str,
        itemsize: int,
        src_shape: Sequence[int],
        dst_shape: Sequence[int],
        pieces: Sequence[Tuple[Sequence[int], Sequence[int]]],
    ) -> None: ...
    def run(self, src: np.ndarray, dst: np.ndarray) -> None: ...
    @property
    def packs(self) -> bool: ...
    @property
    def workspace_bytes(self) -> int: ...

def allgather_i64(comm: Comm, values: Sequence[int]) -> List[int]: ...
def copy_box(
    src: np.ndarray,
    src_start: Sequence[int],
    dst: np.ndarray,
    dst_start: Sequence[int],
    extent: Sequence[int],
) -> None: ...
def stats() -> Dict[str, int]: ...
def reset_stats() -> None: ...
def library_version() -> str: ...
def library_path() -> str: ...
