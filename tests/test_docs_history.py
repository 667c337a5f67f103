"""No commit hashes in the docs, scripts, examples, Slurm files or pyshard's comments and strings.

The docs describe the code as it is; the history of how it got there belongs in the commit log.
A hex word of 7-40 characters that ``git cat-file`` resolves to a commit of this repository is
a commit hash. Every text file git knows under docs/, scripts/, examples/ and slurm/ is read
whole (``.jsonl`` result files keep their recorded fields and are skipped); in ``pyshard/``,
the comments and string literals of every ``.py`` file. Skipped where git or the repository's
history is not at hand (an sdist).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tokenize
from pathlib import Path
from typing import Dict, Iterable, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHOLE_DIRS = ("docs", "scripts", "examples", "slurm")
HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")


def _git(*args: str, stdin: str = "") -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def _files(top: str) -> List[Path]:
    """The files git tracks or would track (not ignored) under ``top``."""
    out = _git("ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", top)
    return sorted({ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()})


def _python_text(source: str) -> str:
    """The comments and string literals of a Python source, one a line."""
    parts = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                parts.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    return "\n".join(parts)


def commits_among(words: Iterable[str]) -> List[str]:
    """The words that name a commit of this repository."""
    words = sorted(set(words))
    if not words:
        return []
    lines = _git("cat-file", "--batch-check", stdin="\n".join(words) + "\n").splitlines()
    # one line per word, in order: "<full id> commit <size>", "<word> missing", "<word> ambiguous"
    return [w for w, line in zip(words, lines) if line.split()[1:2] == ["commit"]]


def hashes_in(texts: Dict[str, str]) -> Dict[str, List[str]]:
    """{file: the commit hashes its text names} for the files that name any."""
    found: Dict[str, List[str]] = {}
    cands = {name: set(HEX.findall(text)) for name, text in texts.items()}
    commits = set(commits_among(w for ws in cands.values() for w in ws))
    for name, ws in cands.items():
        hit = sorted(ws & commits)
        if hit:
            found[name] = hit
    return found


def _texts() -> Dict[str, str]:
    texts = {}
    for top in WHOLE_DIRS:
        for p in _files(top):
            if p.suffix == ".jsonl":
                continue
            try:
                texts[str(p.relative_to(ROOT))] = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:  # images and other binary files
                continue
    for p in _files("pyshard"):
        if p.suffix == ".py":
            texts[str(p.relative_to(ROOT))] = _python_text(p.read_text(encoding="utf-8"))
    return texts


@pytest.fixture(scope="module")
def git_history() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        _git("rev-parse", "--verify", "HEAD^{commit}")
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout with history")


def test_no_commit_hash_in_docs_scripts_or_comments(git_history: None) -> None:
    found = hashes_in(_texts())
    listing = "\n".join(f"  {name}: {', '.join(ws)}" for name, ws in sorted(found.items()))
    assert not found, (
        "commit hashes in docs, scripts or comments (state what the code does and what was "
        "measured; the history is in the commit log):\n" + listing
    )


def test_the_scan_finds_a_commit_hash(git_history: None) -> None:
    """The scan flags this checkout's own HEAD at any abbreviation, in prose and in a Python
    comment or docstring, and not a hex word that names no commit."""
    head = _git("rev-parse", "HEAD").strip()
    short, full = head[:9], head
    texts = {
        "a.md": f"The tables measured pyshard at {short} (fast path).",
        "b.md": f"full id {full}, and 0000000 and cafe123 and 1234567890abcdef0 here",
        "c.py": _python_text(f'def f():\n    """At {short}."""\n    return 1  # see {full}\n'),
        "d.md": "no hash here, only deadbeef0 and a 64-hex " + "ab" * 32,
    }
    found = hashes_in(texts)
    assert found.get("a.md") == [short]
    assert found.get("b.md") == [full]
    assert found.get("c.py") == sorted([short, full])
    assert "d.md" not in found


def test_python_text_is_comments_and_strings_only() -> None:
    text = _python_text("x = 1  # a comment\ny = 'a string'\nabcdef1 = 2\n")
    assert "# a comment" in text and "'a string'" in text
    assert "abcdef1" not in text
