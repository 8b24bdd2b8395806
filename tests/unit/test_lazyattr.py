"""A package's lazily exported names: imported on first use, kept, and an unknown name is the usual
AttributeError (so `hasattr` and `from pkg import nope` behave as for any module)."""

from __future__ import annotations

import sys
import types

import pytest

from pipeline.lazyattr import lazy_attrs


@pytest.fixture
def pkg(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    root, leaf = types.ModuleType("lazypkg"), types.ModuleType("lazypkg.leaf")
    leaf.value = object()  # type: ignore[attr-defined]
    loaded: list[str] = []
    root.__path__ = []

    def find(name: str) -> types.ModuleType:  # stands in for importlib.import_module
        loaded.append(name)
        return leaf

    monkeypatch.setattr("pipeline.lazyattr.importlib.import_module", find)
    monkeypatch.setitem(sys.modules, "lazypkg", root)
    root.__getattr__ = lazy_attrs("lazypkg", {"value": "leaf"})  # type: ignore[method-assign]
    root.loaded = loaded  # type: ignore[attr-defined]
    return root


def test_a_name_is_imported_from_its_module_on_first_use_only(pkg: types.ModuleType) -> None:
    assert pkg.loaded == []
    first = pkg.value
    assert first is sys.modules["lazypkg"].__dict__["value"]  # kept: no second lookup
    assert pkg.value is first
    assert pkg.loaded == ["lazypkg.leaf"]


def test_an_unknown_name_is_an_attribute_error(pkg: types.ModuleType) -> None:
    with pytest.raises(AttributeError, match="'lazypkg' has no attribute 'nope'"):
        _ = pkg.nope
    assert not hasattr(pkg, "other")
    assert pkg.loaded == []
