"""`pipeline patch draft` on the compat fixture (ATOM T1 × aiter A2..A4), and `patch apply` refusing
a draft that still holds a placeholder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.gitw import GitRepo
from pipeline.lock import Lock
from pipeline.patchq.draft import PLACEHOLDER, is_draft, placeholders_in
from pipeline.patchq.model import PatchSeries
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos, fixture_lock


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("draft"))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fx: CompatRepos) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    return ["--atom-repo", str(fx.atom), "--aiter-repo", str(fx.aiter), "--patches-dir", str(tmp_path / "p")]


def draft(env: list[str], fx: CompatRepos, aiter: str, *more: str) -> int:
    return main(["patch", "draft", *env, "--atom", fx.t["T1"], "--aiter", fx.a[aiter], *more])


def test_one_draft_clean_except_for_its_placeholder(
    env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert draft(env, fx, "A2") == 0
    out = capsys.readouterr().out
    (patch,) = PatchSeries.load(tmp_path / "p")
    assert patch.name == "0001-draft-fused-qk.patch" and is_draft(patch)
    assert patch.field("X-Aiter-After") == fx.a["A2"][:12]
    assert patch.atom_range.start == fx.t["T1"][:12] and patch.atom_range.end is None
    assert f"pipeline patch draft --atom {fx.t['T1']} --aiter {fx.a['A2']}" in patch.body
    assert "`kv_cache: Tensor | None` is now `kv_cache_k: Tensor | None` (same slot)" in patch.body
    # the seed's shape: None passed for the whole cache needs no split; `self.kv_cache` does
    line = 1 + next(
        i
        for i, t in enumerate(
            GitRepo(fx.atom).read_blob(fx.t["T1"], "atom/models/dense.py").decode().splitlines()
        )
        if "a.fused_qk(qkv" in t
    )
    assert placeholders_in(patch) == [
        f"atom/models/dense.py:{line} `a.fused_qk(qkv, w, eps, kv_cache_k=self.kv_cache, "
        f"kv_cache_v={PLACEHOLDER}, index_cache=self.index_cache, block_size=blk, q_out=self.q_buf)`"
    ]
    # styles.py's rmsnorm call never binds (issue 28 §4: an error no aiter pin fixes), and is
    # named as not mechanical: the drafted tree is clean except for it and the placeholder
    assert "not mechanical: atom/models/styles.py:17 aiter.rmsnorm [too-many-positional]" in out
    assert (
        "the check of the drafted tree: 1 error(s), 1 placeholder(s) to fill (all at the calls not drafted "
        "above); clean except for those and the placeholders" in out
    )
    # what git applies: the series with the draft applies to the pin
    assert main(["patch", "check", *env, "--atom", fx.t["T1"], "--aiter", fx.a["A2"]]) == 0
    assert "0001-draft-fused-qk.patch: applies" in capsys.readouterr().out


def test_every_mechanical_fix_drafted_and_the_rest_named(
    env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert draft(env, fx, "A4", "--dry-run") == 0
    assert (
        "the check of the drafted tree: 3 error(s), 2 placeholder(s) to fill (all at the calls not drafted "
        "above); clean except for those and the placeholders" in capsys.readouterr().out
    )
    assert draft(env, fx, "A4", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert [x["function"].rsplit(".", 1)[-1] for x in d["drafts"]] == [
        "fused_qk", "gemm", "scale_op", "reduce_v1", "make_required", "kwonly_later",
    ]  # fmt: skip
    assert {x["kind"] for x in d["not_mechanical"]} == {
        "missing-function",
        "missing-module",
        "too-many-positional",
    }
    # the drafted tree fails only where no draft was possible; the placeholder binds as a keyword
    left = {(e["path"], e["line"]) for e in d["drafted_check"]["errors"]}
    assert left == {(x["path"], x["line"]) for x in d["not_mechanical"]}
    split, required = d["drafted_check"]["placeholders"]
    assert f"kv_cache_v={PLACEHOLDER}" in split and f"fm.make_required(p, flag={PLACEHOLDER})" in required
    series = PatchSeries.load(tmp_path / "p")
    assert len(series) == 6 and all(is_draft(p) for p in series)
    assert main(["patch", "check", *env, "--atom", fx.t["T1"], "--aiter", fx.a["A4"]]) == 0


def test_apply_refuses_a_draft_with_a_placeholder_until_it_is_filled(
    env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert draft(env, fx, "A4") == 0
    capsys.readouterr()
    atom = GitRepo(fx.atom)
    lock = tmp_path / "m.toml"
    lock.write_text(fixture_lock(fx, "T1", "A4").to_toml())
    refs = atom.git("for-each-ref")
    apply = ["patch", "apply", *env, "--lock", str(lock), "--workdir", str(tmp_path / "w")]
    assert main(apply) == ExitCode.PATCH
    err = capsys.readouterr().err
    assert (
        "0001-draft-fused-qk.patch is a draft with 1 placeholder(s)" in err
        and f"kv_cache_v={PLACEHOLDER}" in err
    )
    for name in (tmp_path / "p").glob("0001-*.patch"):  # written: the next draft is refused, by its line
        name.write_text(name.read_text().replace(f"kv_cache_v={PLACEHOLDER}", "kv_cache_v=v"))
    assert main(apply) == ExitCode.PATCH
    err = capsys.readouterr().err
    assert "0005-draft-make-required.patch is a draft with 1 placeholder(s)" in err
    assert f"atom/models/gemm.py:19 `fm.make_required(p, flag={PLACEHOLDER})`" in err
    assert atom.git("for-each-ref") == refs and "patches" not in lock.read_text()  # nothing done
    # a person writes the value (in the draft, and in the next one's context lines): the series applies
    for path in (tmp_path / "p").glob("*.patch"):
        path.write_text(path.read_text().replace(f"flag={PLACEHOLDER}", "flag=True"))
    assert main(apply) == 0


def test_dry_run_writes_nothing(
    env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert draft(env, fx, "A3", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "(dry run) aiter.scale_op" in out and "+        return so(y, factor=2.0), z" in out
    assert not (tmp_path / "p").exists()
    assert main(["patch", "draft", *env, "--atom", fx.t["T1"]]) == ExitCode.USAGE


def test_the_rebuild_summary_says_whether_a_draft_exists_for_a_blocked_pair(
    env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.config import load_settings
    from pipeline.rebuild import draft_note
    from pipeline.sources.mirrors import open_mirror

    settings = load_settings(
        env={"PIPELINE_CACHE_DIR": str(tmp_path / "cache"), "PIPELINE_PATCHES_DIR": str(tmp_path / "p")},
        cwd=tmp_path,
    )
    for url in (fx.atom, fx.aiter):
        open_mirror(settings, str(url), fetch=True)  # what `pin` leaves behind

    def lock(a: str) -> Lock:
        return fixture_lock(fx, "T1", a)

    assert draft_note(settings, lock("A4")).startswith("no draft fix in the series: `pipeline patch draft")
    assert draft(env, fx, "A4") == 0
    capsys.readouterr()
    note = draft_note(settings, lock("A4"))
    assert note.startswith(
        "draft fix in the series, not reviewed yet: 0001-draft-fused-qk.patch (1 placeholder"
    )
    assert "0005-draft-make-required.patch (1 placeholder(s) to fill)" in note
    # at A2 only the fused_qk draft is needed (the others wait for A3/A4 by their X-Aiter-After)
    assert (
        draft_note(settings, lock("A2"))
        == "draft fix in the series, not reviewed yet: 0001-draft-fused-qk.patch (1 placeholder(s) to fill)"
    )
