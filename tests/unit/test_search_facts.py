"""`pin --auto` passes a commit only while every fact the breaking calls relied on holds.

`search._Unchanged.between` on hand-made first-parent diffs (newest commit first; each change is
(module, blob at that commit, blob at its first parent)); blob texts come from the run's raw cache.
"""

from __future__ import annotations

from pipeline.compat.search import _Unchanged

C1, C2, C3 = "c1" * 20, "c2" * 20, "c3" * 20  # newest first


def walk(
    changes: dict[str, list[tuple[str, str | None, str | None]]], raw: dict[str, bytes] | None = None
) -> _Unchanged:
    u = object.__new__(_Unchanged)
    u.commits = [C1, C2, C3]
    u.order = {sha: i for i, sha in enumerate(u.commits)}
    u.changes = changes
    u.raw = dict(raw or {})
    u._mentions, u._stars = {}, {}
    return u


def test_a_change_of_a_module_read_stops_the_pass() -> None:
    u = walk({C2: [("aiter.ops.fused", "new", "old")]})
    facts = frozenset({("m", "aiter.ops.fused", True, "new")})
    assert not u.between(C1, C3, facts)
    assert u.between(C1, C2, facts)  # C2 itself is the first commit not passed


def test_a_file_added_beside_a_module_with_its_own_file_changes_nothing() -> None:
    # Going back from C2, aiter/ops/extra.py goes away: aiter.ops keeps its __init__.py.
    u = walk({C2: [("aiter.ops.extra", "blob", None)]})
    assert u.between(C1, C3, frozenset({("f", "aiter.ops", True, ""), ("m", "aiter.ops", True, "i")}))


def test_a_namespace_package_goes_with_its_last_file() -> None:
    # aiter.utility has no __init__.py: its existence rests on the files below it.
    goes = walk({C2: [("aiter.utility.fp4", "blob", None)]})  # going back, the file goes
    appears = walk({C2: [("aiter.utility.fp4", None, "blob")]})  # going back, the file appears
    exists = frozenset({("e", "aiter.utility", True, "")})
    absent = frozenset({("e", "aiter.utility", False, "")})
    assert not goes.between(C1, C3, exists)
    assert appears.between(C1, C3, exists)
    assert not appears.between(C1, C3, absent)
    assert goes.between(C1, C3, absent)


def test_a_module_that_appears_where_one_was_missing_stops_the_pass() -> None:
    u = walk({C2: [("aiter.ops.gone", None, "blob")]})
    assert not u.between(C1, C3, frozenset({("f", "aiter.ops.gone", False, "")}))
    assert not u.between(C1, C3, frozenset({("m", "aiter.ops.gone", True, "")}))


def test_a_star_imported_module_that_still_does_not_name_the_function() -> None:
    facts = frozenset({("n", "aiter.ops.mha", False, "fused_qk")})
    newer = b"from .cache import *\n\ndef mha(q):\n    pass\n"
    edited = b"from .cache import *\n\ndef mha(q, k):\n    pass\n"
    names_it = b"from .cache import *\n\ndef fused_qk(q):\n    pass\n"
    more_stars = b"from .cache import *\nfrom .fused import *\n\ndef mha(q):\n    pass\n"
    raw = {"new": newer, "edit": edited, "names": names_it, "stars": more_stars}
    assert walk({C2: [("aiter.ops.mha", "new", "edit")]}, raw).between(C1, C3, facts)
    assert not walk({C2: [("aiter.ops.mha", "new", "names")]}, raw).between(C1, C3, facts)
    assert not walk({C2: [("aiter.ops.mha", "new", "stars")]}, raw).between(C1, C3, facts)
    assert not walk({C2: [("aiter.ops.mha", None, "edit")]}, raw).between(C1, C3, facts)


def test_unknown_or_reversed_commits_are_never_passed() -> None:
    u = walk({})
    facts = frozenset({("m", "aiter", True, "x")})
    assert not u.between(C3, C1, facts)
    assert not u.between(C1, "f" * 40, facts)
    assert u.between(C1, C3, facts)
