"""The check's third round on fixture repositories (tests/fixtures/compat_round3.py): a cause for every
break, calls written after a change against the older signature, signature guards, calls that never bind."""

from __future__ import annotations

import pytest

from pipeline.compat import CheckReport, Finding, run_check
from pipeline.gitw import GitRepo
from tests.fixtures.compat_round3 import Round3Repos, build_round3_repos


@pytest.fixture(scope="module")
def r3(tmp_path_factory: pytest.TempPathFactory) -> Round3Repos:
    return build_round3_repos(tmp_path_factory.mktemp("round3"))


def check(r3: Round3Repos, t: str, a: str) -> CheckReport:
    return run_check(GitRepo(r3.atom), r3.t[t], GitRepo(r3.aiter), r3.a[a])


def line(r3: Round3Repos, t: str, path: str, needle: str) -> int:
    text = GitRepo(r3.atom).read_blob(r3.t[t], path)
    assert text is not None
    (hit,) = [i for i, s in enumerate(text.decode().splitlines(), 1) if needle in s]
    return hit


def at(report: CheckReport, path: str, line: int) -> Finding:
    got = [f for f in report.findings if (f.path, f.line) == (path, line)]
    assert len(got) == 1, [(f.path, f.line, f.kind) for f in report.findings]
    return got[0]


# -- §2 a cause for every finding ------------------------------------------------------------------


def test_a_removed_method_of_an_aiter_object_names_its_commit(r3: Round3Repos) -> None:
    path = "atom/models/r3.py"
    f = at(check(r3, "V1", "R7"), path, line(r3, "V1", path, "get_runner().legacy(x)"))
    assert (f.severity, f.kind) == ("error", "missing-function")
    assert f.cause is not None and f.cause.commit.sha == r3.a["R3"], f.message
    assert f.cause.last_good == r3.a["R2"]
    assert "`Runner().legacy` removed from aiter/ops/runner.py by aiter " + r3.a["R3"][:10] in f.message


def test_a_changed_method_of_an_aiter_object_names_its_commit(r3: Round3Repos) -> None:
    path = "atom/models/r3.py"
    f = at(check(r3, "V1", "R7"), path, line(r3, "V1", path, "get_runner().run(x, 0.5)"))
    assert f.severity == "error" and f.cause is not None and f.cause.commit.sha == r3.a["R2"], f.message


def test_an_op_registered_from_a_python_def_names_the_commit_that_changed_the_def(r3: Round3Repos) -> None:
    path = "atom/models/r3.py"
    f = at(check(r3, "V1", "R7"), path, line(r3, "V1", path, "torch.ops.aiter.fused_add("))
    assert f.severity == "error" and f.function == "torch.ops.aiter.fused_add"
    assert f.cause is not None and f.cause.commit.sha == r3.a["R4"], f.message
    assert "w inserted at position 2 by aiter " + r3.a["R4"][:10] in f.message


def test_a_name_removed_before_the_call_was_written_names_its_removal(r3: Round3Repos) -> None:
    # late.py was created after R5 removed old_helper: neither the ATOM commit's date nor the call's
    # blame date finds it; it existed at an older aiter, and the commit that removed it is named.
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "aiter.old_helper(x)"))
    assert (f.severity, f.kind) == ("error", "missing-function")
    assert f.cause is not None and f.cause.commit.sha == r3.a["R5"], f.message
    assert "`old_helper` removed from aiter/ops/old.py by aiter " + r3.a["R5"][:10] in f.message
    assert "before the call's lines were written" in f.message


def test_every_error_names_a_commit_or_says_why_not(r3: Round3Repos) -> None:
    for t, a in (("V1", "R7"), ("V2", "R7"), ("V2", "R6")):
        for f in check(r3, t, a).errors:
            assert f.cause is not None or f.preexisting or "No cause named" in f.message, f.message


# -- §4 a call that never binds ----------------------------------------------------------------------


def test_a_call_no_aiter_ever_bound_is_an_error_no_pin_fixes(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "aiter.other_helper(x, x)"))
    assert (f.severity, f.kind, f.preexisting) == ("error", "too-many-positional", True), f.message
    assert "no aiter pin fixes it" in f.message and "a waiver with a reason" in f.message
