"""Sphinx configuration of pyshard's guide and API reference (bash scripts/docs.sh).

Why Sphinx + autodoc (and not MkDocs + mkdocstrings): pyshard's docstrings are already
reStructuredText (``literals``, :func:`roles`), which autodoc renders as they are, with
cross-references; Sphinx's doctest builder runs the ``{doctest}`` blocks of these pages as
part of the docs build (at 1 rank, in one process); and MyST lets the guide be Markdown and
include the existing Markdown pages (docs/*.md, slurm/README.md) without copying them.
Examples that need 2 ranks are scripts in docs/examples/, run by scripts/docs.sh under
mpiexec; the pages include the scripts and the output of that run.
"""

from __future__ import annotations

import doctest
import os
import re

import pyshard  # the installed one: .venv's editable install (scripts/setup.sh)

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)

project = "pyshard"
author = "pyshard developers"
copyright = "pyshard developers"
version = release = pyshard.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.doctest", "myst_parser"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# Pygments cannot lex the manifest example of docs/checkpoints.md (a ```json block that
# elides with "..."); it is rendered as plain text. Every other warning is an error.
suppress_warnings = ["misc.highlighting_failure"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
autodoc_preserve_defaults = True

# Doctests run at 1 rank (one process; MPI is initialised by mpi4py at import).
doctest_global_setup = """
import numpy as np
from mpi4py import MPI
import pyshard as ps
from pyshard import Partial, Replicate, Shard
"""
doctest_default_flags = (
    doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
)

html_theme = "furo"
html_title = f"pyshard {release}"
html_static_path: list = []
html_show_sourcelink = False


def _check_api_page() -> None:
    """Every name in pyshard.__all__ is documented on api.rst (a new public name fails the
    docs build until it is added there)."""
    with open(os.path.join(HERE, "api.rst")) as f:
        text = f.read()
    # automodule entries (the modules of pyshard.fft) document a module, not a name
    documented = set(re.findall(r"^\.\. auto(?!module)\w+:: pyshard\.(\w+)", text, flags=re.M))
    documented |= set(re.findall(r"^```\{auto(?!module)\w+\} pyshard\.(\w+)", text, flags=re.M))
    missing = sorted(set(pyshard.__all__) - documented)
    extra = sorted(documented - set(pyshard.__all__))
    if missing or extra:
        raise RuntimeError(
            f"docs/site/api.rst: names of pyshard.__all__ not documented: {missing}; "
            f"documented but not in pyshard.__all__: {extra}"
        )


def _checkpoints_reference() -> None:
    """docs/checkpoints.md from its "## API" section on, for checkpoints.md to include (its
    opening example is a fragment; the page shows a script that runs instead)."""
    with open(os.path.join(DOCS, "checkpoints.md")) as f:
        text = f.read()
    at = text.find("\n## API")
    if at < 0:
        raise RuntimeError('docs/checkpoints.md has no "## API" section: fix docs/site/conf.py')
    os.makedirs(os.path.join(DOCS, "_build", "generated"), exist_ok=True)
    with open(os.path.join(DOCS, "_build", "generated", "checkpoints-reference.md"), "w") as f:
        f.write(text[at + 1 :])


_check_api_page()
_checkpoints_reference()
