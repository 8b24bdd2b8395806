"""Names a package exports without importing their modules until first use (PEP 562).

A command's start-up imports only what it runs: `pipeline check` must not load the pin
search, nor the fetch machinery that `pipeline.sources` also exports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attrs(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `name` comes from `package.<where[name]>`, imported then
    and kept in the package (later uses are plain attribute reads)."""

    def __getattr__(name: str) -> Any:
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{mod}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
