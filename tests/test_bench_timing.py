"""pyshard.bench.timing.alternated: each callable once a round, in turn, the first rounds left
out of the medians. A fake clock that the calls advance gives exact times (no real timing in
a pass/fail test)."""

from __future__ import annotations

from mpi4py import MPI

from pyshard.bench import timing
from pyshard.bench.timing import alternated


def test_alternated_runs_each_in_turn_and_skips_the_first_rounds(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    calls = []

    def a():
        calls.append("a")
        now[0] += 10.0 if calls.count("a") <= 2 else 1.0 + calls.count("a")  # 4, 5, 6 after

    def b():
        calls.append("b")
        now[0] += 3.0

    t = alternated({"a": a, "b": b}, MPI.COMM_SELF, rounds=5, skip=2)
    assert calls == ["a", "b"] * 5
    assert t == {"a": 5.0, "b": 3.0}  # a's two slow rounds left out: the median of 4, 5, 6
