"""run_check and `pipeline check` on fixture aiter/ATOM repositories built by code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.compat import CheckReport, Finding, run_check
from pipeline.compat.pysource import SCHEMA
from pipeline.errors import ExitCode
from pipeline.gitw import GitRepo
from tests.fixtures.compat_history import HistoryRepos, build_history_repos
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos, cli_on, fixture_lock


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat"))


def check(fx: CompatRepos, t: str, a: str, **kw: object) -> CheckReport:
    return run_check(GitRepo(fx.atom), fx.t[t], GitRepo(fx.aiter), fx.a[a], **kw)  # type: ignore[arg-type]


def line_of(fx: CompatRepos, rev: str, path: str, needle: str, nth: int = 0) -> int:
    text = GitRepo(fx.atom).read_blob(rev, path)
    assert text is not None
    hits = [i for i, line in enumerate(text.decode().splitlines(), 1) if needle in line]
    return hits[nth]


def at(report: CheckReport, path: str, line: int) -> Finding:
    got = [f for f in report.findings if f.path == path and f.line == line]
    assert len(got) == 1, [(f.path, f.line, f.kind) for f in report.findings]
    return got[0]


def test_written_against_pin_is_compatible_and_counts_are_honest(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A1c")
    assert [f.kind for f in r.errors] == ["too-many-positional"]  # the one ATOM bug: see below
    assert r.calls_checked == 21  # `aiter.gemm(x, **kw)`: its explicit argument is checked
    reasons = sorted(u.reason for u in r.unchecked)
    assert reasons == [
        "arguments passed only through *args/**kwargs",
        "dynamic getattr on aiter",
        "resolved through dynamic attribute access or an unparseable module",
    ]
    assert r.calls_unchecked == 3
    assert sorted((u.repo, u.path) for u in r.unparseable) == [
        ("aiter", "aiter/ops/broken.py"),
        ("atom", "atom/broken.py"),
    ]
    # The one call that no aiter accepts is an ATOM bug no pin fixes, and a TypeError whenever it runs:
    # an error (the model's gate decides whether it is on the path), marked pre-existing.
    (w,) = r.findings
    assert (w.severity, w.kind, w.preexisting) == ("error", "too-many-positional", True)
    assert w.line == line_of(fx, fx.t["T1"], "atom/models/styles.py", "aiter.rmsnorm(x, w, 1e-6, True)")
    assert "no aiter pin fixes it" in w.message
    assert "it needs a patch of ATOM or a waiver with a reason" in w.message


def test_inserted_parameter_named_with_its_cause(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A2")
    assert not r.ok
    f = at(r, "atom/models/dense.py", line_of(fx, fx.t["T1"], "atom/models/dense.py", "aiter.fused_qk("))
    assert (f.severity, f.kind, f.function) == ("error", "positional-shift", "aiter.fused_qk")
    assert f.cause is not None and f.cause.commit.sha == fx.a["A2"]
    assert f.cause.last_good == fx.a["A1c"]
    assert "kv_cache_v inserted at position 5 by aiter " + fx.a["A2"][:10] + " (2026-02-01," in f.message
    assert "positional arguments 5–7 of this call now bind one slot later" in f.message
    assert "argument 6 `0` (int) lands on `index_cache: Tensor | None`" in f.message
    assert "argument 7 `q` (Tensor) lands on `block_size: int`" in f.message


def test_positional_shift_with_unknown_types(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A2")
    f = at(
        r, "atom/models/dense.py", line_of(fx, fx.t["T1"], "atom/models/dense.py", "a.fused_qk(qkv, w, eps")
    )
    assert (f.severity, f.kind) == ("error", "positional-shift")
    assert f.cause is not None and f.cause.commit.sha == fx.a["A2"]
    assert (
        "argument 5 `self.index_cache` was written for `index_cache`, now lands on `kv_cache_v`" in f.details
    )
    assert "binds without error" in f.message


def test_rewrapped_function_is_checked_like_the_original(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A2")
    f = at(r, "atom/models/dense.py", line_of(fx, fx.t["T1"], "atom/models/dense.py", "traced_fused_qk(qkv"))
    assert f.kind == "positional-shift" and f.cause is not None and f.cause.commit.sha == fx.a["A2"]


def test_removed_and_renamed_parameters(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A3")
    path = "atom/models/gemm.py"
    for needle in ("y = gemm(x, w, self.scale", "z = self.fn(x, w"):
        f = at(r, path, line_of(fx, fx.t["T1"], path, needle))
        assert f.kind == "positional-shift" and f.cause is not None and f.cause.commit.sha == fx.a["A3"]
        assert "scale removed (was position 3)" in f.message
        assert "argument 4 `self.bias` was written for `bias`, now lands on `out`" in f.details
    gone = at(r, "atom/models/acts.py", line_of(fx, fx.t["T1"], "atom/models/acts.py", "return g(x)"))
    assert (gone.severity, gone.kind) == ("error", "missing-module")
    assert gone.cause is not None and gone.cause.commit.sha == fx.a["A3"]
    assert "aiter/ops/gone.py removed or moved by aiter" in gone.message
    f = at(r, path, line_of(fx, fx.t["T1"], path, "so(y, scale=2.0)"))
    assert f.kind == "unexpected-keyword" and f.cause is not None and f.cause.commit.sha == fx.a["A3"]
    assert "scale renamed to `factor`" in f.message


def test_reordered_required_keyword_only_and_removed(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A4")
    path = "atom/models/gemm.py"
    expect = {
        "reduce_v1(p, lse, len(p), out)": ("positional-shift", "moved from position 4 to 3"),
        "fm.make_required(p)": ("missing-argument", "flag made required"),
        "kwonly_later(p, 1)": ("too-many-positional", "mode made keyword-only"),
    }
    for needle, (kind, phrase) in expect.items():
        f = at(r, path, line_of(fx, fx.t["T1"], path, needle))
        assert f.kind == kind and phrase in f.message, f.message
        assert f.cause is not None and f.cause.commit.sha == fx.a["A4"]
    acts = at(r, "atom/models/acts.py", line_of(fx, fx.t["T1"], "atom/models/acts.py", "aiter.act("))
    assert (acts.severity, acts.kind) == ("error", "missing-function")
    assert acts.cause is not None and acts.cause.commit.sha == fx.a["A4"]
    assert "`act` removed from aiter/ops/fused.py" in acts.message


def test_guarded_missing_functions_are_warnings(fx: CompatRepos) -> None:
    r = check(fx, "T1", "A4")
    path = "atom/models/styles.py"
    for needle in ("old_fn(x)", "aiter.act(x)"):
        f = at(r, path, line_of(fx, fx.t["T1"], path, needle, nth=-1))
        assert (f.severity, f.kind) == ("warning", "missing-function")
    # compat module alias, namespace package, keyword-only and `x: T = None` calls stay clean
    clean = {f.line for f in r.findings if f.path == path}
    for needle in ("gemm_fp4(x, w, xs, ws)", "e8m0_to_f32(xs)", "mla_decode_fwd(x, w, xs, sm_scale=0.5)"):
        assert line_of(fx, fx.t["T1"], path, needle) not in clean
    assert not [f for f in r.findings if "offs_op" in f.function]


def test_lagging_atom_is_blamed_on_the_aiter_change_not_called_preexisting(fx: CompatRepos) -> None:
    # T1b is dated after A2, but the call lines were written at T1 (before A2).
    r = check(fx, "T1b", "A2")
    f = at(r, "atom/models/dense.py", line_of(fx, fx.t["T1b"], "atom/models/dense.py", "aiter.fused_qk("))
    assert (f.severity, f.preexisting) == ("error", False)
    assert f.cause is not None and f.cause.commit.sha == fx.a["A2"]


def test_explicit_baseline_finds_the_silent_shift(fx: CompatRepos) -> None:
    r = check(fx, "T1b", "A2", baseline_aiter_rev=fx.a["A1c"])
    line = line_of(fx, fx.t["T1b"], "atom/models/dense.py", "a.fused_qk(qkv, w, eps")
    f = at(r, "atom/models/dense.py", line)
    assert f.kind == "positional-shift" and f.written_against == fx.a["A1c"]


def test_updated_atom_is_compatible(fx: CompatRepos) -> None:
    r = check(fx, "T2", "A4")
    assert r.ok and r.findings == [] and r.calls_checked == 9 and r.calls_unchecked == 0


def test_reads_the_given_rev_not_the_checkout(fx: CompatRepos, tmp_path: Path) -> None:
    # The patch stage commits on a throwaway branch of a work tree: read (repo, rev).
    work = tmp_path / "atom-work"
    subprocess.run(["git", "clone", "-q", str(fx.atom), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", fx.t["T1"]], check=True)
    r = run_check(GitRepo(work), fx.t["T2"], GitRepo(fx.aiter), fx.a["A4"])
    assert r.ok and r.atom_sha == fx.t["T2"]


def test_cache_warm_run_gives_the_same_report(fx: CompatRepos, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = check(fx, "T1", "A4", cache_dir=cache)
    # (aiter's whole history log is kept apart, opened only when a call's evidence needs it)
    assert sorted(p.name for p in cache.iterdir()) == [
        *(f"compat-{kind}-v{SCHEMA}.pickle" for kind in ("aiter", "atom", "facts", "logs")),
        f"compat-nights-v{SCHEMA}",  # the verdicts the next check may carry (pipeline.compat.carry)
        f"compat-reports-v{SCHEMA}",  # one small file per report: a warm run reads only its own
    ]
    (report_file,) = (cache / f"compat-reports-v{SCHEMA}").iterdir()
    warm = check(fx, "T1", "A4", cache_dir=cache)
    assert warm.to_json() == cold.to_json()
    report_file.unlink()  # summaries and git facts only
    assert check(fx, "T1", "A4", cache_dir=cache).to_json() == cold.to_json()
    for p in [*cache.glob("*.pickle"), *cache.glob("*/*.pickle")]:
        p.write_bytes(b"not a pickle")
    again = check(fx, "T1", "A4", cache_dir=cache)
    assert again.to_json() == cold.to_json()


# -- the command ------------------------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fx: CompatRepos) -> list[str]:
    return cli_on(fx, "check", tmp_path, monkeypatch)


def test_cli_exit_codes_and_json(
    cli_env: list[str], fx: CompatRepos, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*cli_env, "--atom", fx.t["T2"], "--aiter", fx.a["A4"], "--format", "json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["compatible"] is True and ok["calls_checked"] == 9

    code = main([*cli_env, "--atom", fx.t["T1"], "--aiter", fx.a["A2"], "--format", "json"])
    assert code == ExitCode.INCOMPATIBLE
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert d["calls_unchecked"] == 3 and d["calls_checked"] == 21
    shift = [f for f in d["findings"] if f["kind"] == "positional-shift"]
    assert len(shift) == 3 and all(f["cause"]["commit"] == fx.a["A2"] for f in shift)
    for f in d["findings"]:
        assert {"path", "line", "function", "severity", "kind", "message"} <= f.keys()
    assert "not compatible" in out.err


def test_cli_sarif_to_file_and_usage_errors(
    cli_env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.sarif"
    code = main([*cli_env, "--atom", fx.t["T1"], "--aiter", fx.a["A3"], "--format", "sarif", "-o", str(out)])
    assert code == ExitCode.INCOMPATIBLE
    s = json.loads(out.read_text())
    assert s["version"] == "2.1.0"
    results = s["runs"][0]["results"]
    assert {r["ruleId"] for r in results} >= {"positional-shift", "unexpected-keyword"}
    assert all(
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("atom/") for r in results
    )
    capsys.readouterr()
    assert main([*cli_env, "--lock", str(tmp_path / "x.toml"), "--atom", "main"]) == ExitCode.USAGE
    assert main([*cli_env, "--atom", "no-such-ref", "--aiter", fx.a["A4"]]) == ExitCode.SOURCE
    assert main([*cli_env, "--format", "xml"]) == ExitCode.USAGE


def test_cli_lock_file(
    cli_env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def lock_for(t: str, a: str) -> Path:
        lock = fixture_lock(fx, t, a)
        path = tmp_path / f"{t}-{a}.toml"
        path.write_text(lock.to_toml())
        return path

    assert main([*cli_env, "--lock", str(lock_for("T2", "A4"))]) == 0
    assert "compatible: 0 error(s)" in capsys.readouterr().out
    assert main([*cli_env, "--lock", str(lock_for("T1", "A2")), "--format", "json"]) == ExitCode.INCOMPATIBLE
    d = json.loads(capsys.readouterr().out)
    assert d["atom"] == fx.t["T1"] and d["aiter"] == fx.a["A2"]


# -- what the call was written for, from the call's own evidence (tests/fixtures/compat_history.py) --


@pytest.fixture(scope="module")
def hx(tmp_path_factory: pytest.TempPathFactory) -> HistoryRepos:
    return build_history_repos(tmp_path_factory.mktemp("history"))


def hcheck(hx: HistoryRepos, t: str, a: str) -> CheckReport:
    return run_check(GitRepo(hx.atom), hx.t[t], GitRepo(hx.aiter), hx.a[a])


def hline(hx: HistoryRepos, t: str, path: str, needle: str, nth: int = 0) -> int:
    text = GitRepo(hx.atom).read_blob(hx.t[t], path)
    assert text is not None
    return [i for i, line in enumerate(text.decode().splitlines(), 1) if needle in line][nth]


SEED = "atom/models/seed.py"


def test_nightly_shift_with_plain_names_is_caught(hx: HistoryRepos) -> None:
    # U2 is dated after H2, so "aiter as of the ATOM date" already has the shift; the call lines
    # were written at U1, for H1. Two sites have no evident type at or after the insertion point.
    r = hcheck(hx, "U2", "H2")
    sites = [hline(hx, "U2", SEED, "aiter.fused_qknorm(", n) for n in range(4)]
    for line in sites:
        f = at(r, SEED, line)
        assert (f.severity, f.kind, f.preexisting) == ("error", "positional-shift", False), f.message
        assert f.cause is not None and f.cause.commit.sha == hx.a["H2"]
        assert f.cause.last_good == hx.a["H1"]
        assert f.written_against is not None and f.written_against != hx.a["H2"]
        assert "kv_cache_v inserted at position 6" in f.message
    blanked = at(r, SEED, sites[1])
    assert "argument 6 `idx` was written for `index_cache`, now lands on `kv_cache_v`" in blanked.details
    sparse = at(r, SEED, sites[3])
    assert "argument 6 `self.index_cache` was written for `index_cache`, now lands on `kv_cache_v`" in (
        sparse.details
    )
    assert not [f for f in r.findings if f.path == SEED and f.line not in sites]


def test_good_older_pin_is_compatible_not_written_for_a_newer_aiter(hx: HistoryRepos) -> None:
    r = hcheck(hx, "U2", "H1")
    assert not [f for f in r.findings if f.path == SEED], [f.message for f in r.findings]


def test_aiter_adapting_to_atom_is_not_a_shift(hx: HistoryRepos) -> None:
    # topk_route(logits, <Tensor>, None) never fit `k: int`; H4 made `k` the Tensor ATOM passes.
    path = "atom/models/route.py"
    for t in ("U2", "U3"):
        r = hcheck(hx, t, "H4")
        assert not [f for f in r.findings if f.path == path], [f.message for f in r.findings]
    # The call fits H4, not the H1 of its blame date: at H1 the pin predates what it was written for
    # (a warning: plain Python does not enforce `k: int`).
    r = hcheck(hx, "U2", "H1")
    f = at(r, path, hline(hx, "U2", path, "aiter.topk_route("))
    assert (f.severity, f.kind, f.preexisting) == ("warning", "type-mismatch", False), f.message
    assert f.written_against == hx.a["H4"] and f.cause is not None and f.cause.commit.sha == hx.a["H4"]
    assert "which the pinned aiter predates" in f.message and "plain Python" in f.message


def test_aiter_moving_a_parameter_to_fit_atom_is_not_a_shift(hx: HistoryRepos) -> None:
    # The real case: ATOM aa29bace68 called pa_reduce_v1 with 8 positionals 7 minutes before aiter
    # 14989519bf moved num_kv_splits to the end "so the ATOM call site stays aligned". Under the
    # blame date's signature `final_lse` lands on `final_output`; under the later one it fits.
    path = "atom/models/route.py"
    line = hline(hx, "U2", path, "aiter.pa_reduce(")
    assert not [f for f in hcheck(hx, "U2", "H4").findings if (f.path, f.line) == (path, line)]
    f = at(hcheck(hx, "U2", "H2"), path, line)  # an older pin really misplaces `out.view(-1, 8)`
    assert (f.severity, f.kind, f.written_against) == ("error", "positional-shift", hx.a["H4"]), f.message
    assert "argument 4 `out.view(-1, 8)` was written for `final_output`, now lands on `num_kv_splits`" in (
        f.details
    )


def test_call_written_ahead_of_aiter_fits_the_later_signature(hx: HistoryRepos) -> None:
    # Blamed at U1 (aiter H1), the call passes a 5th positional and `gemma_norm`, which only H4 has:
    # blame alone would call H4's layout a shift of `self.eps`. The fit decides: written for H4.
    path = "atom/models/other.py"
    line = hline(hx, "U2", path, "allreduce_norm(x, y, w, self.bias")
    assert not [f for f in hcheck(hx, "U2", "H4").findings if f.line == line and f.path == path]
    f = at(hcheck(hx, "U2", "H1"), path, line)
    assert (f.severity, f.preexisting, f.written_against) == ("error", False, hx.a["H4"]), f.message
    assert f.cause is not None and f.cause.commit.sha == hx.a["H4"]
    assert "which the pinned aiter predates" in f.message


def test_new_problem_behind_a_preexisting_one_is_an_error(hx: HistoryRepos) -> None:
    path = "atom/models/other.py"
    line = hline(hx, "U2", path, "legacy_add(x, y, z, alpha=2.0)")
    old = at(hcheck(hx, "U2", "H1"), path, line)
    assert (old.severity, old.kind, old.preexisting) == ("error", "too-many-positional", True)
    assert "fails the same way (3 positional arguments given" in old.message
    new = at(hcheck(hx, "U2", "H4"), path, line)
    assert (new.severity, new.kind, new.preexisting) == ("error", "unexpected-keyword", False), new.message
    assert "fails the same way" not in new.message
    assert "New at this pin" in new.message
    assert new.cause is not None and new.cause.commit.sha == hx.a["H4"]


def test_type_clash_is_an_error_for_an_op_and_a_warning_for_plain_python(hx: HistoryRepos) -> None:
    path = "atom/models/other.py"
    r = hcheck(hx, "U2", "H4")
    op = at(r, path, hline(hx, "U2", path, "aiter.norm_op("))
    assert (op.severity, op.kind) == ("error", "type-mismatch")
    assert op.cause is not None and op.cause.commit.sha == hx.a["H4"]
    plain = at(r, path, hline(hx, "U2", path, "scale_rows(x, None)"))
    assert (plain.severity, plain.kind) == ("warning", "type-mismatch")
    assert "plain Python" in plain.message
    assert (op.callee, plain.callee) == ("op", "python")


def test_cause_follows_a_moved_function(hx: HistoryRepos) -> None:
    path = "atom/models/other.py"
    f = at(hcheck(hx, "U2", "H3"), path, hline(hx, "U2", path, "moe_gemm(x, w, s)"))
    assert (f.severity, f.kind) == ("error", "missing-argument"), f.message
    assert f.cause is not None and f.cause.commit.sha == hx.a["H3"]
    assert "`moe_gemm` moved from aiter/ops/moe.py to aiter/ops/moe2/gemm.py by aiter" in f.message


def test_missing_function_names_where_it_moved(hx: HistoryRepos) -> None:
    path = "atom/models/other.py"
    f = at(hcheck(hx, "U2", "H3"), path, hline(hx, "U2", path, "ex.shuffle_w(x)"))
    assert (f.severity, f.kind) == ("error", "missing-function"), f.message
    assert f.cause is not None and f.cause.commit.sha == hx.a["H3"]
    assert "`shuffle_w` moved from aiter/ops/extra.py to aiter/ops/zz.py by aiter" in f.message


def test_cause_names_a_star_import_that_now_wins(hx: HistoryRepos) -> None:
    path = "atom/models/other.py"
    f = at(hcheck(hx, "U2", "H3"), path, hline(hx, "U2", path, "pick(x, n)"))
    assert (f.severity, f.kind) == ("error", "missing-argument"), f.message
    assert f.cause is not None and f.cause.commit.sha == hx.a["H3"]
    assert (
        "`aiter.pick` now resolves to aiter/ops/zz.py instead of aiter/ops/extra.py "
        "(star import order in aiter/__init__.py)"
    ) in f.message
