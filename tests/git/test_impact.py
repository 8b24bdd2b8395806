"""`pipeline impact` and run_impact on the compat fixture repositories (aiter A1c..A3, ATOM T1)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.compat.impact import ImpactReport, ModelSpec, _Bisect, _Range, run_impact
from pipeline.errors import ExitCode
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos, cli_on, fixture_lock


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("impact"))


def impact(fx: CompatRepos, base: str, head: str, tmp: Path, **kw: object) -> ImpactReport:
    return run_impact(
        GitRepo(fx.atom),
        [("T1", fx.t["T1"])],
        GitRepo(fx.aiter),
        fx.a[base],
        fx.a[head],
        cache_dir=tmp / "cache",
        **kw,  # type: ignore[arg-type]
    )


def sites_of(r: ImpactReport) -> dict[str, list[tuple[str, int, str]]]:
    """{definition name: [(ATOM path, line, cause sha)]}"""
    return {
        d.name: [(s.finding.path, s.finding.line, s.cause.commit.sha if s.cause else "") for s in d.sites]
        for d in r.definitions
    }


def atom_line(fx: CompatRepos, path: str, needle: str) -> int:
    text = GitRepo(fx.atom).read_blob(fx.t["T1"], path)
    assert text is not None
    return next(i for i, line in enumerate(text.decode().splitlines(), 1) if needle in line)


def aiter_line(fx: CompatRepos, rev: str, path: str, needle: str) -> int:
    text = GitRepo(fx.aiter).read_blob(fx.a[rev], path)
    assert text is not None
    return next(i for i, line in enumerate(text.decode().splitlines(), 1) if needle in line)


def test_one_commit_names_the_sites_it_breaks_and_the_definition(fx: CompatRepos, tmp_path: Path) -> None:
    r = impact(fx, "A1c", "A2", tmp_path)
    assert r.commits == 1
    (d,) = r.definitions
    assert (d.name, d.path) == ("fused_qk", "aiter/ops/fused.py")
    assert d.line == aiter_line(fx, "A2", "aiter/ops/fused.py", "def fused_qk(")
    assert sorted(line for _, line, _ in sites_of(r)["fused_qk"]) == sorted(
        [
            atom_line(fx, "atom/models/dense.py", "aiter.fused_qk("),
            atom_line(fx, "atom/models/dense.py", "a.fused_qk(qkv"),
            atom_line(fx, "atom/models/dense.py", "traced_fused_qk(qkv"),
        ]
    )
    assert {c for _, _, c in sites_of(r)["fused_qk"]} == {fx.a["A2"]}
    assert r.breaks_on_path  # no model named: every break counts


def test_a_range_names_each_break_with_its_own_commit(fx: CompatRepos, tmp_path: Path) -> None:
    r = impact(fx, "A1c", "A3", tmp_path)
    got = sites_of(r)
    assert {c for _, _, c in got["fused_qk"]} == {fx.a["A2"]}
    assert {c for _, _, c in got["gemm"]} == {fx.a["A3"]}
    assert {c for _, _, c in got["scale_op"]} == {fx.a["A3"]}
    # a module deleted at the head: located where the function was defined at the base
    gone = next(d for d in r.definitions if d.path == "aiter/ops/gone.py")
    assert gone.at == r.aiter_base and gone.line == 1


def test_calls_already_broken_at_the_base_are_not_this_ranges(fx: CompatRepos, tmp_path: Path) -> None:
    r = impact(fx, "A2", "A3", tmp_path)
    assert "fused_qk" not in sites_of(r)  # broken by A2, before the range
    assert r.atoms[0].broken_at_base >= 3
    assert set(sites_of(r)) >= {"gemm", "scale_op"}
    assert impact(fx, "A1b", "A1c", tmp_path).definitions == ()  # a harmless addition breaks nothing


def test_bisection_finds_the_commit_of_the_range(fx: CompatRepos, tmp_path: Path) -> None:
    aiter = GitRepo(fx.aiter)
    rng = _Range(aiter, fx.a["A1"], fx.a["A4"])
    assert len(rng.commits) == 5
    bis = _Bisect(GitRepo(fx.atom), fx.t["T1"], aiter, fx.a["A4"], rng, tmp_path / "cache")
    try:
        g, d = "atom/models/gemm.py", "atom/models/dense.py"
        gemm = (g, atom_line(fx, g, "y = gemm(x, w"), 13, "aiter.gemm")
        fused = (d, atom_line(fx, d, "aiter.fused_qk("), 9, "aiter.fused_qk")
        a3, a2 = bis.first_broken(gemm), bis.first_broken(fused)
    finally:
        bis.close()
    assert a3 is not None and a3.commit.sha == fx.a["A3"] and a3.last_good == fx.a["A2"]
    assert a2 is not None and a2.commit.sha == fx.a["A2"] and a2.last_good == fx.a["A1c"]


@dataclass
class _Reach:
    paths: set[str]

    def on_path(self, path: str) -> bool:
        return path in self.paths

    def evidence(self, path: str) -> str:
        return "imported by the model" if path in self.paths else "not imported"


def test_per_model_reach_and_the_gate(fx: CompatRepos, tmp_path: Path) -> None:
    models = [ModelSpec("Dense-M", facts="dense"), ModelSpec("Unknown-M", facts=None)]
    r = impact(
        fx, "A1c", "A3", tmp_path, models=models, reach_of=lambda sha, facts: _Reach({"atom/models/dense.py"})
    )
    for s in r.sites:
        reach = {m: how for m, how, _ in s.reach}
        assert reach["Unknown-M"] == "on-path"  # no architecture: when unsure, it gates
        assert reach["Dense-M"] == ("on-path" if s.finding.path == "atom/models/dense.py" else "off-path")
    # only the model that can say where its path goes: gemm.py is off it, so A2..A3 does not gate
    only = impact(fx, "A2", "A3", tmp_path, models=models[:1], reach_of=lambda sha, f: _Reach({"atom/x.py"}))
    assert only.sites and not only.breaks_on_path
    assert {r["level"] for r in only.to_sarif()["runs"][0]["results"]} == {"warning"}
    assert "on no model's path" in only.summary()


def test_sarif_primary_locations_are_aiter_and_sites_related(fx: CompatRepos, tmp_path: Path) -> None:
    r = impact(fx, "A1c", "A2", tmp_path)
    run = r.to_sarif()["runs"][0]
    assert run["versionControlProvenance"][0]["revisionId"] == fx.a["A2"]
    (res,) = run["results"]
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "aiter/ops/fused.py"
    assert loc["region"]["startLine"] == aiter_line(fx, "A2", "aiter/ops/fused.py", "def fused_qk(")
    related = [x["physicalLocation"]["artifactLocation"]["uri"] for x in res["relatedLocations"]]
    assert len(related) == 3
    at = f"https://github.com/ROCm/ATOM/blob/{fx.t['T1']}/atom/models/dense.py#L"
    assert all(u.startswith(at) for u in related)
    assert res["level"] == "error" and "[ATOM T1 atom/models/dense.py:" in res["message"]["text"]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fx: CompatRepos) -> list[str]:
    return cli_on(fx, "impact", tmp_path, monkeypatch)


def test_cli_formats_and_exit_codes(
    cli_env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = ["--aiter-base", fx.a["A1c"], "--aiter-head", fx.a["A2"]]
    assert main([*cli_env, *rng, "--atom", fx.t["T1"], "--format", "json"]) == ExitCode.INCOMPATIBLE
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert [f["function"] for f in d["functions"]] == ["fused_qk"]
    assert d["functions"][0]["definition"]["path"] == "aiter/ops/fused.py"
    assert all(s["cause"]["commit"] == fx.a["A2"] for s in d["functions"][0]["sites"])
    assert "breaks ATOM calls" in out.err
    sarif = tmp_path / "impact.sarif"
    code = main([*cli_env, *rng, "--atom", fx.t["T1"], "--format", "sarif", "-o", str(sarif)])
    assert code == ExitCode.INCOMPATIBLE and json.loads(sarif.read_text())["version"] == "2.1.0"
    # nothing breaks: exit 0, and the text says so
    harmless = ["--aiter-base", fx.a["A1b"], "--aiter-head", fx.a["A1c"]]
    assert main([*cli_env, *harmless, "--atom", fx.t["T1"]]) == 0
    assert "no break: no ATOM call breaks" in capsys.readouterr().out
    assert main([*cli_env, *rng, "--atom", "no-such-ref"]) == ExitCode.SOURCE
    assert main([*cli_env, "--aiter-head", fx.a["A2"]]) == ExitCode.USAGE  # --aiter-base is required


def test_cli_default_atoms_are_main_and_every_lock(
    cli_env: list[str], fx: CompatRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    atom = GitRepo(fx.atom)
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "m.toml").write_text(fixture_lock(fx, "T1", "A1c").to_toml())
    code = main([*cli_env, "--aiter-base", fx.a["A1c"], "--aiter-head", fx.a["A2"], "--format", "json"])
    d = json.loads(capsys.readouterr().out)
    assert [(a["ref"], a["sha"]) for a in d["atom"]] == [
        ("main", atom.rev_parse("main")),
        ("lock m", fx.t["T1"]),
    ]
    by_atom = {(s["atom"], f["function"]) for f in d["functions"] for s in f["sites"]}
    # main (T3) calls legacy_fn, which A2 removes; the lock's T1 calls fused_qk the A1 way
    assert by_atom == {("main", "legacy_fn"), ("lock m", "fused_qk")}
    assert code == ExitCode.INCOMPATIBLE


def test_on_github_actions_the_annotations_are_on_the_aiter_definitions(
    cli_env: list[str], fx: CompatRepos, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    rng = ["--aiter-base", fx.a["A1c"], "--aiter-head", fx.a["A2"], "--atom", fx.t["T1"]]
    assert main([*cli_env, *rng]) == ExitCode.INCOMPATIBLE
    out = capsys.readouterr()
    line = aiter_line(fx, "A2", "aiter/ops/fused.py", "def fused_qk(")
    assert (
        f"::error file=aiter/ops/fused.py,line={line}::`fused_qk` breaks ATOM calls: atom/models/dense.py:"
        in (out.out + out.err)
    )
