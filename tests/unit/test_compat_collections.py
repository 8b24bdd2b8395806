"""No cyclic garbage collection while a check runs (`checker.no_collections`): the check's records
are long-lived and acyclic, and a collection of them all was a tenth of a night's check."""

from __future__ import annotations

import gc

import pytest

from pipeline.compat.checker import no_collections


def test_no_collection_runs_inside_and_what_was_made_is_left_out_after() -> None:
    frozen = gc.get_freeze_count()
    try:
        with no_collections():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        gc.unfreeze()


def test_collection_is_enabled_again_after_an_error() -> None:
    try:
        with pytest.raises(RuntimeError), no_collections():
            raise RuntimeError("a check that fails")
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_caller_that_had_disabled_collection_keeps_it_disabled() -> None:
    gc.disable()
    try:
        with no_collections():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
