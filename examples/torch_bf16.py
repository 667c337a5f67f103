"""A torch bfloat16 tensor through pyshard, each result checked against torch on rank 0.

    mpiexec -n 4 python examples/torch_bf16.py [--dir DIR] [--rows 13 --cols 10]

The tensor enters through DLPack (viewed, not copied), is distributed as ``[Shard(0)]``,
transposed to ``[Shard(1)]`` (one Alltoallv), gathered to every rank, reduced from
``Partial("sum")`` contributions (accumulated in float32 and rounded once: compared bit for
bit with torch's ``stack(...).float().sum(0).bfloat16()``; torch's step-by-step bfloat16 sum
is shown beside it), then saved and loaded into other layouts. Results go back to torch with
``torch.from_dlpack(pyshard.to_dlpack(y.local))``: a ``torch.bfloat16`` tensor on the same
memory. Needs torch and ml_dtypes (``pip install 'pyshard[ml]' torch``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.bench.cli import count_arg

Row = Tuple[str, bool, str]


def same_memory(t, a: np.ndarray) -> bool:  # noqa: ANN001 - t: a torch.Tensor
    """Whether tensor t and array a start at the same address (an empty one always does: an
    empty tensor's data_ptr() is 0 whatever memory it came from)."""
    return a.size == 0 or t.data_ptr() == a.ctypes.data


def to_torch(a: np.ndarray):  # noqa: ANN201 - a torch.Tensor
    """A pyshard result as a torch tensor on the same memory."""
    import torch

    t = torch.from_dlpack(ps.to_dlpack(a))
    assert same_memory(t, a), "to_dlpack copied"
    return t


def run(comm: MPI.Comm, directory: str, rows: int = 13, cols: int = 10) -> List[Row]:
    """Every step, as (what, ok, detail) rows; the same list on every rank (rank 0 checks
    against torch and broadcasts its verdicts)."""
    import torch

    p, rank = comm.size, comm.rank
    mesh = ps.Mesh(comm, (p,))
    gen = torch.Generator().manual_seed(18)
    t = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)  # the same on every rank
    contrib = [torch.randn(rows, cols, generator=gen).to(torch.bfloat16) for _ in range(p)]
    out: List[Row] = []

    def check(what: str, ok: bool, detail: str = "") -> None:
        ok, detail = comm.bcast((bool(ok), detail) if rank == 0 else None, root=0)
        out.append((what, ok, detail))

    x = ps.distribute(t, mesh, [Shard(0)])
    # from_local wraps this rank's rows of the tensor: a bfloat16 view of its memory, no copy
    mine_t = t[x.box]
    x0 = ps.from_local(mine_t, mesh, [Shard(0)], global_shape=tuple(t.shape))
    mine = torch.equal(to_torch(x.local), mine_t) and same_memory(mine_t, x0.local)
    mine = comm.allreduce(int(mine), op=MPI.MIN)
    check(
        "distribute [S(0)]",
        mine == 1 and x.dtype == np.dtype("bfloat16"),
        f"{x.dtype}; from_local views the tensor's rows through DLPack without a copy",
    )

    before = ps.comm_stats()
    y = x.redistribute([Shard(1)])
    used = {k: v - before.get(k, 0) for k, v in ps.comm_stats().items() if v != before.get(k, 0)}
    shards = comm.gather((y.box, y.local), root=0)
    ok = rank != 0 or all(torch.equal(to_torch(s), t[b]) for b, s in shards)
    check("transpose [S(0)] -> [S(1)]", ok, f"collectives {used}")

    full = y.full()
    ft = to_torch(full)
    check(
        "gather [S(1)] -> [R]",
        ft.dtype == torch.bfloat16 and torch.equal(ft, t),
        f"torch.from_dlpack(to_dlpack(y.local)): {ft.dtype}, same memory",
    )

    part = ps.from_local(contrib[rank], mesh, [Partial("sum")], global_shape=(rows, cols))
    red = to_torch(part.redistribute([Shard(0)]).full())
    once = torch.stack(contrib).float().sum(0).bfloat16()  # float32 sum rounded once
    step = contrib[0]
    for c in contrib[1:]:
        step = step + c  # torch rounds to bfloat16 after every addition
    same = torch.equal(red.view(torch.int16), once.view(torch.int16))
    ndiff = int((step.view(torch.int16) != once.view(torch.int16)).sum())
    check(
        "reduce [P(sum)] -> [S(0)]",
        same,
        f"bitwise the float32 sum rounded once; a step-by-step bfloat16 sum differs on "
        f"{ndiff} of {rows * cols} elements",
    )

    ps.save(directory, {"w": y, "acc": part})
    back = ps.load(directory, mesh, {"w": [Shard(0)], "acc": [Replicate()]})
    w, acc = to_torch(back["w"].full()), to_torch(back["acc"].local)
    info = ps.checkpoint_info(directory)["arrays"]
    check(
        "save [S(1)], [P(sum)]; load -> [S(0)], [R]",
        torch.equal(w, t) and torch.equal(acc.view(torch.int16), once.view(torch.int16)),
        f"manifest dtypes {sorted({str(e['dtype']) for e in info.values()})}",
    )
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary one)")
    ap.add_argument("--rows", type=count_arg(0), default=13)
    ap.add_argument("--cols", type=count_arg(0), default=10)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    import torch

    tmp = None
    directory = args.dir
    if directory is None:
        tmp = tempfile.mkdtemp(prefix="pyshard-torch-") if comm.rank == 0 else None
        directory = comm.bcast(tmp, root=0) + "/ckpt"
    try:
        rows = run(comm, directory, args.rows, args.cols)
    finally:
        comm.Barrier()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if comm.rank == 0:
        print(f"torch {torch.__version__}, {comm.size} rank(s), a ({args.rows}, {args.cols}) "
              f"torch.bfloat16 tensor")  # fmt: skip
        for what, ok, detail in rows:
            print(f"  {what:42s} {'ok' if ok else 'FAILED'}  {detail}")
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
