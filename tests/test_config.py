"""pyshard.config: every PYSHARD_* setting parsed in one place, one error style, settable from
Python, the docs table generated from it, and no other module reading the environment."""

from __future__ import annotations

import os
import re

import pytest

import pyshard as ps
from pyshard import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_defaults_and_environment(monkeypatch):
    for name, s in config.SETTINGS.items():
        monkeypatch.delenv(name, raising=False)
        assert config.get(name) == s.default, name
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", " 4096 ")
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 4096
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "0")  # read again when it changes
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
    monkeypatch.setenv("PYSHARD_TRANSPORT", "MPI")
    assert config.get("PYSHARD_TRANSPORT") == "mpi"
    monkeypatch.setenv("PYSHARD_VALIDATE", "on")
    assert config.get("PYSHARD_VALIDATE") is True


@pytest.mark.parametrize(
    "name,raw,accepts",
    [
        ("PYSHARD_SHM_MIN_BYTES", "-1", "an integer >= 0"),
        ("PYSHARD_SHM_MIN_BYTES", "16k", "an integer >= 0"),
        ("PYSHARD_NODE_SIZE", "0", "an integer >= 1"),
        ("PYSHARD_COUNT_LIMIT", "7", "an integer in [8, 2^31-1]"),
        ("PYSHARD_VALIDATE", "maybe", "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_CUDA_AWARE", "2", "0/1, false/true, no/yes or off/on"),
        ("PYSHARD_TRANSPORT", "fast", "auto, shm, mpi, direct or staged"),
        ("PYSHARD_HALO_METHOD", "mail",
         "one of auto, shm, persistent, p2p, datatype, neighbor, tune"),
    ],
)
def test_one_error_style(monkeypatch, name, raw, accepts):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}, got {raw!r}")):
        config.get(name)
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {accepts}, got {raw!r}")):
        config.set(name, raw)


def test_python_settings_win_and_are_restored(monkeypatch):
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "100")
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0, PYSHARD_TRANSPORT="mpi"):
        assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
        assert config.get("PYSHARD_TRANSPORT") == "mpi"
        with ps.config.override(PYSHARD_SHM_MIN_BYTES="7"):  # strings parse as the env's
            assert config.get("PYSHARD_SHM_MIN_BYTES") == 7
        assert config.get("PYSHARD_SHM_MIN_BYTES") == 0
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 100
    config.set("PYSHARD_SHM_MIN_BYTES", None)  # the default, whatever the environment says
    assert config.get("PYSHARD_SHM_MIN_BYTES") is None
    config.reset("PYSHARD_SHM_MIN_BYTES")
    assert config.get("PYSHARD_SHM_MIN_BYTES") == 100
    with pytest.raises(KeyError, match="no setting named 'PYSHARD_FASTER'"):
        config.get("PYSHARD_FASTER")


def test_docs_table_is_generated_from_the_settings():
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        doc = f.read()
    assert config.table() in doc, "regenerate: python -m pyshard config > docs/configuration.md"


def test_no_other_module_reads_a_setting():
    """The environment's PYSHARD_* variables are read by pyshard/config.py alone."""
    found = []
    for top, _, files in os.walk(os.path.join(ROOT, "pyshard")):
        for f in files:
            if not f.endswith(".py") or f == "config.py" and top.endswith("pyshard"):
                continue
            path = os.path.join(top, f)
            with open(path) as fh:
                for n, line in enumerate(fh, 1):
                    if re.search(r"(environ|getenv)\b.*PYSHARD_", line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
