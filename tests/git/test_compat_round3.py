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


# -- §1 a call written after the change, against the older signature ------------------------------


def test_a_call_written_after_a_change_for_the_older_layout_is_a_shift(r3: Round3Repos) -> None:
    # late.py entered ATOM after R6 inserted num_splits, yet its literals fit R1's layout: 32 on
    # block_size, True on `causal: bool` (at the pin True lands on `block_size: int`).
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "paged_attn(q, k, v, 32, True)"))
    assert (f.severity, f.kind, f.written_against) == ("error", "positional-shift", r3.a["R1"]), f.message
    assert f.cause is not None and f.cause.commit.sha == r3.a["R6"]
    assert (
        f"The call, added in ATOM {r3.t['V2'][:10]} on 2026-03-01, fits aiter's signature before "
        + (r3.a["R6"][:10])
        in f.message
    )


def test_a_plain_python_clash_from_an_older_layout_is_an_error(r3: Round3Repos) -> None:
    # `gather(x, 0)`: 0 lands on `use_custom: bool` (a plain Python function: alone, a warning), but the
    # call fits R1's `gather(x, dim)` cleanly: written for another layout, a shift.
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "gather(x, 0)"))
    assert (f.severity, f.kind, f.preexisting) == ("error", "positional-shift", False), f.message
    assert f.cause is not None and f.cause.commit.sha == r3.a["R6"]


def test_a_call_written_before_the_change_is_still_a_shift_with_its_cause(r3: Round3Repos) -> None:
    path = "atom/models/r3.py"
    f = at(check(r3, "V1", "R7"), path, line(r3, "V1", path, "paged_attn(q, k, v, 64)"))
    assert (f.kind, f.cause and f.cause.commit.sha) == ("positional-shift", r3.a["R6"])
    assert "The call, added in ATOM" not in f.message  # written before R6: the ordinary case


def test_a_call_that_gained_a_keyword_is_still_screened_for_a_shift(r3: Round3Repos) -> None:
    # dec.py was created calling decode(q, kv, o, m); its positionals grew and it gained `q_scale=`
    # (V5, for R9); R10 then inserted page_size/nhead_kv before sm_scale, the day before V6. The
    # call's keyword does not exist in the layout of the file's creation, and the layout as of V6's
    # date is the pin's: the screen must still see that its positionals land elsewhere.
    path = "atom/models/dec.py"
    f = at(check(r3, "V6", "R10"), path, line(r3, "V6", path, "return decode("))
    assert (f.severity, f.kind, f.written_against) == ("error", "positional-shift", r3.a["R9"]), f.message
    assert f.cause is not None and f.cause.commit.sha == r3.a["R10"], f.message
    assert "argument 5 `scale` written for `sm_scale` now lands on `page_size`" in f.message


def test_written_for_the_older_layout_is_clean_at_an_older_pin(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    report = check(r3, "V2", "R5")
    for needle in ("paged_attn(q, k, v, 32, True)", "gather(x, 0)"):
        n = line(r3, "V2", path, needle)
        assert not [f for f in report.findings if (f.path, f.line) == (path, n)]


# -- §3 guards the code itself evaluates ----------------------------------------------------------


def test_a_branch_its_signature_guard_rules_out_is_a_note(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    guard = line(r3, "V2", path, 'if "z" in inspect.signature(stage_fn).parameters:')
    new, old = line(r3, "V2", path, "return stage_fn(x, z, y)"), line(r3, "V2", path, "return stage_fn(x, y)")
    at_r7, at_r6 = check(r3, "V2", "R7"), check(r3, "V2", "R6")
    # R7 has `z`: the if-branch binds (checked, clean); the else-branch cannot run.
    assert not [f for f in at_r7.findings if (f.path, f.line) == (path, new)]
    f = at(at_r7, path, old)
    assert (f.severity, f.kind) == ("note", "unreachable-at-pin"), f.message
    assert (
        f"runs only when `'z' in inspect.signature(stage_fn).parameters` (line {guard}) is false" in f.message
    )
    assert "`stage_fn` has parameters (x, z, y)" in f.message
    # R6 has no `z`: the other way round.
    assert not [f for f in at_r6.findings if (f.path, f.line) == (path, old)]
    g = at(at_r6, path, new)
    assert (g.severity, g.kind) == ("note", "unreachable-at-pin"), g.message
    assert at_r7.ok is False and f not in at_r7.errors
    from pipeline.compat.report import Counts

    assert Counts.of(at_r7).notes == 2 and "2 note(s) (not reached at this pin)" in Counts.of(at_r7).summary()


def test_a_length_guard_is_evaluated(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "aiter.other_helper(1, 2)"))
    assert (f.severity, f.kind) == ("note", "unreachable-at-pin"), f.message
    assert "`len(inspect.signature(aiter.other_helper).parameters) == 2`" in f.message


def test_a_guard_the_check_cannot_evaluate_makes_a_warning_naming_it(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    report = check(r3, "V2", "R6")
    f = at(report, path, line(r3, "V2", path, "stage_fn(1, 2, 3)"))
    guard = line(r3, "V2", path, "inspect.signature(stage_fn).parameters.keys() >=")
    assert f.severity == "warning" and f"(line {guard}), which the check cannot evaluate" in f.message
    # A chain that is not plain (a name assigned again on one branch) is not evaluated.
    derived = "atom/models/derived.py"
    g = at(check(r3, "V3", "R6"), derived, line(r3, "V3", derived, "# not plain"))
    test = line(r3, "V3", derived, 'if names[0] == "z":')
    assert g.severity == "warning" and f"`names[0] == 'z'` (line {test}), which the check cannot" in g.message


def test_the_shim_installed_for_one_layout_is_checked_where_its_guards_hold(r3: Round3Repos) -> None:
    # ATOM's sglang shim shape: positional names kept by kind, `names.index(...)` in a `try` that
    # returns, a slice from that index compared with a list. At R6/R7 the layout is there: the call
    # under it is checked (7 positionals, 6 parameters); at R5 `num_splits` is not: unreachable.
    path = "atom/models/late.py"
    call = line(r3, "V2", path, "return original(q, k, v, 1, bs, True, 7)")
    shim = at(check(r3, "V2", "R7"), path, call)
    assert (shim.severity, shim.kind) == ("error", "too-many-positional"), shim.message
    old = at(check(r3, "V2", "R5"), path, call)
    index = line(r3, "V2", path, 'at = names.index("num_splits")')
    assert (old.severity, old.kind) == ("note", "unreachable-at-pin"), old.message
    assert f'runs only when `at = names.index("num_splits")` (line {index}) is true' in old.message


@pytest.mark.parametrize(
    "label", ["module flag", "fallback flag", "position", "count", "derived flag", "runtime and layout"]
)
def test_a_guard_on_a_value_derived_from_the_signature_is_evaluated(r3: Round3Repos, label: str) -> None:
    # stage_fn is (x, y) at R6 and (x, z, y) at R7: under each guard, the call for the other layout
    # is not reached (a note), the one for the pin's layout is checked and binds.
    path = "atom/models/derived.py"

    def findings(pin: str) -> dict[int, Finding]:
        return {f.line: f for f in check(r3, "V3", pin).findings if f.path == path}

    at_r7, at_r6 = findings("R7"), findings("R6")
    new = line(r3, "V3", path, f"# {label}: new")
    assert new not in at_r7, at_r7[new].message
    assert (at_r6[new].severity, at_r6[new].kind) == ("note", "unreachable-at-pin"), at_r6[new].message
    if label != "runtime and layout":  # (that one has no call for the old layout)
        old = line(r3, "V3", path, f"# {label}: old")
        assert old not in at_r6, at_r6[old].message
        assert (at_r7[old].severity, at_r7[old].kind) == ("note", "unreachable-at-pin"), at_r7[old].message


# -- §5 fewer unchecked calls, and only aiter's --------------------------------------------------


def test_an_attribute_chain_typed_by_constructors_and_local_imports_is_checked(r3: Round3Repos) -> None:
    path = "atom/models/r3.py"
    report = check(r3, "V1", "R7")
    f = at(report, path, line(r3, "V1", path, "get_group().comm.ar.register(x, 1)"))
    assert f.function == "aiter.dist.comm.get_group().comm.ar.register"
    assert (f.kind, f.defined_at) == ("too-many-positional", "aiter/dist/ar.py:2"), f.message


def test_calls_that_are_not_aiter_calls_are_not_counted_unchecked(r3: Round3Repos) -> None:
    report = check(r3, "V1", "R7")
    # `Rope.register_buffer` is torch.nn.Module's; `torch.ops.aiter.atom_own` is an op ATOM registers.
    assert [(u.path, u.function) for u in report.unchecked if u.path != "atom/models/quant.py"] == []


def test_a_dispatch_table_binds_to_the_function_its_literal_key_selects(r3: Round3Repos) -> None:
    path = "atom/models/quant.py"
    report = check(r3, "V1", "R7")
    f = at(report, path, line(r3, "V1", path, "f(x, None, None, 7)"))
    assert (f.function, f.kind, f.defined_at) == (
        "aiter.get_quant(QuantType.per_Token)",
        "too-many-positional",
        "aiter/ops/quant.py:11",
    ), f.message
    # A functools.partial entry: the function, with the keywords the partial gives.
    g = at(report, path, line(r3, "V1", path, "get_quant(QuantType.per_1x128)(x, transpose=True"))
    assert (g.kind, g.defined_at) == ("unexpected-keyword", "aiter/ops/quant.py:15"), g.message
    assert "`per_group_quant` has no parameter `bogus`" in g.message
    # One name set from two keys: which entry is not known, and the call is listed unchecked, saying why.
    (u,) = [u for u in report.unchecked if u.path == path]
    assert u.line == line(r3, "V1", path, "return g(x, 1, 2, 3, 4, 5)")
    assert (
        u.reason
        == "calling the result of `get_quant` (a dispatch table: the key is not one literal or enum member)"
    )


# -- §4 a call that never binds ----------------------------------------------------------------------


def test_a_call_no_aiter_ever_bound_is_an_error_no_pin_fixes(r3: Round3Repos) -> None:
    path = "atom/models/late.py"
    f = at(check(r3, "V2", "R7"), path, line(r3, "V2", path, "aiter.other_helper(x, x)"))
    assert (f.severity, f.kind, f.preexisting) == ("error", "too-many-positional", True), f.message
    assert "no aiter pin fixes it" in f.message and "a waiver with a reason" in f.message
