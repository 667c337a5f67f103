"""Optional dependencies, imported at first use: the one lazy import (cupy, ml_dtypes)."""

from __future__ import annotations

import importlib
from typing import Any, Tuple, Type

__all__ = ["OptionalModule"]


class OptionalModule:
    """``OptionalModule("cupy")()`` is the module, imported at the first call, or None where
    it does not import (``catch``: the exceptions that mean "not there"). ``module`` and
    ``tried`` hold the outcome (a test may set them to act as if it were not installed)."""

    __slots__ = ("name", "catch", "module", "tried")

    def __init__(self, name: str, catch: Tuple[Type[BaseException], ...] = (ImportError,)):
        self.name = name
        self.catch = catch
        self.module: Any = None
        self.tried = False

    def __call__(self) -> Any:
        if not self.tried:
            self.tried = True
            try:
                self.module = importlib.import_module(self.name)
            except self.catch:
                self.module = None
        return self.module
