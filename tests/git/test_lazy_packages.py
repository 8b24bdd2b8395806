"""The packages that resolve their names on first use still give every name they list."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("package", ["pipeline.sources", "pipeline.compat"])
def test_every_listed_name_resolves(package: str) -> None:
    mod = importlib.import_module(package)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018
