"""`pipeline recipe import` and `pipeline recipe drift` on a fixture ATOM whose recipe changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.recipes.recipe import load_recipe
from tests.fixtures.gitfixture import commit_all, git, init_repo, write_files
from tests.unit.test_recipe_import import TWO_VARIANTS


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    repo = init_repo(tmp_path_factory.mktemp("atom") / "atom")
    shas: dict[str, str] = {}
    write_files(repo, {"recipes/Foo.md": TWO_VARIANTS, "README.md": "ATOM\n"})
    shas["c1"] = commit_all(repo, "Foo recipe", "2026-01-01T00:00:00+00:00")
    write_files(repo, {"README.md": "ATOM, again\n"})
    shas["c1b"] = commit_all(repo, "unrelated", "2026-01-02T00:00:00+00:00")
    text = TWO_VARIANTS.replace("--kv_cache_dtype fp8 \\", "--kv_cache_dtype fp8 \\\n  --block-size 128 \\")
    text = text.replace("export ATOM_FLAG=1", "export ATOM_FLAG=2")
    write_files(repo, {"recipes/Foo.md": text})
    shas["c2"] = commit_all(repo, "Foo: block size 128, ATOM_FLAG=2", "2026-01-03T00:00:00+00:00")
    write_files(repo, {"recipes/Foo.md": text.replace("0.9000|±  |0.0080", "0.9200|±  |0.0075")})
    shas["c3"] = commit_all(repo, "Foo: new validated numbers", "2026-01-04T00:00:00+00:00")
    git(repo, "rm", "-q", "recipes/Foo.md")
    shas["c4"] = commit_all(repo, "drop the Foo recipe", "2026-01-05T00:00:00+00:00")
    return repo, shas


@pytest.fixture
def recipes(upstream: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo, shas = upstream
    out = tmp_path / "recipes"
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(out))
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    args = ["recipe", "import", "--atom-repo", str(repo), "--atom", shas["c1"], "recipes/Foo.md"]
    assert main(args) == 0
    assert main(args) == ExitCode.USAGE  # exists: refused without --force
    assert main([*args, "--force"]) == 0
    return out


def test_import_writes_one_valid_recipe_per_mi355_variant(
    upstream: tuple[Path, dict[str, str]], recipes: Path
) -> None:
    _, shas = upstream
    assert sorted(p.name for p in recipes.iterdir()) == ["Foo-M1-FP4.yaml", "Foo-M1-FP8.yaml"]
    r = load_recipe(recipes / "Foo-M1-FP4.yaml")
    assert r.source == f"ROCm/ATOM recipes/Foo.md @ {shas['c1']}"
    assert r.environment == {"AITER_QUICK_REDUCE_QUANTIZATION": "INT4", "ATOM_FLAG": "1"}


def test_import_of_an_unparseable_recipe_names_the_line_and_writes_nothing(
    upstream: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, _ = upstream
    bad = Path(repo) / "recipes/Bad.md"
    server = "python -m atom.entrypoints.openai_server --model $M"
    md = "# B\n\n## On 4xMI355\n\n```bash\n" + server + "\n```\n"
    write_files(repo, {"recipes/Bad.md": md})
    sha = commit_all(repo, "bad recipe", "2026-02-01T00:00:00+00:00")
    try:
        out = tmp_path / "out"
        code = main(
            ["recipe", "import", "--atom-repo", str(repo), "--atom", sha, "recipes/Bad.md", "-o", str(out)]
        )
        assert code == ExitCode.USAGE
        err = capsys.readouterr().err
        assert "recipes/Bad.md@" in err and ":6: $M is not set in the block" in err
        assert not out.exists()
    finally:
        git(repo, "reset", "-q", "--hard", "HEAD~1")
        assert not bad.exists()


def _drift(repo: Path, rev: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(["recipe", "drift", "--atom-repo", str(repo), "--atom", rev, "--json"]) == 0
    data: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return data


def test_drift_names_the_commit_of_each_change(
    upstream: tuple[Path, dict[str, str]], recipes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, shas = upstream
    by = {d["recipe"]: d for d in _drift(repo, shas["c3"], capsys)}
    fp4 = by["Foo-M1-FP4"]
    changes = {c["what"]: c for c in fp4["changes"]}  # type: ignore[union-attr, index]
    assert set(changes) == {"server", "environment", "gsm8k reference"}
    assert changes["server"]["old"] == [] and changes["server"]["new"] == ["--block-size", "128"]
    assert [c["sha"] for c in changes["server"]["commits"]] == [shas["c2"]]
    assert changes["environment"]["new"] == {"ATOM_FLAG": "2"}
    assert changes["gsm8k reference"]["old"] == [0.9, 0.008]
    assert changes["gsm8k reference"]["new"] == [0.92, 0.0075]
    assert [c["sha"] for c in changes["gsm8k reference"]["commits"]] == [shas["c3"]]
    fp8 = {c["what"] for c in by["Foo-M1-FP8"]["changes"]}  # type: ignore[union-attr, index]
    assert fp8 == set()  # FP8 sets no ATOM_FLAG and keeps its numbers: only FP4 changed
    # No change between the recipe's own commit and an unrelated one.
    assert all(not d["changes"] for d in _drift(repo, shas["c1b"], capsys))


def test_drift_reports_a_removed_source(
    upstream: tuple[Path, dict[str, str]], recipes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, shas = upstream
    for d in _drift(repo, shas["c4"], capsys):
        assert d["removed_by"] == shas["c4"]
    capsys.readouterr()
    assert main(["recipe", "drift", "--atom-repo", str(repo), "--atom", shas["c4"]]) == 0
    assert "source recipes/Foo.md removed by ATOM" in capsys.readouterr().out
