"""The serving benchmark's --save-result format, read statically from a pinned ATOM tree.

The fixture ATOM carries, as atom/benchmarks/benchmark_serving.py, a script in the exact code
shape of ATOM's (tests/servers/standin_benchmark_serving.py: the literal `result = {...}`, the
`process_one_metric` helper with f-string keys, `result_json[...]`, the file-name f-string).
Render fails clearly when a key the gate reads is renamed or a flag the runner passes is gone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.errors import RenderError
from pipeline.gitw import GitRepo
from pipeline.recipes.recipe import BenchmarkCheck, load_recipe
from pipeline.smoke import benchfmt
from pipeline.smoke.checks import evaluate_benchmark
from tests.fixtures.build_repos import BuildRepos, make_build_repos
from tests.fixtures.gitfixture import commit_all, init_repo, write_files
from tests.git.test_render_context import render

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "MiniMax-M3-MXFP4.yaml"  # runs `python -m atom.benchmarks.benchmark_serving`
SCRIPT = (REPO / "tests" / "servers" / "standin_benchmark_serving.py").read_text()


def atom_with(tmp_path: Path, script: str) -> tuple[GitRepo, str]:
    repo = tmp_path / "atom"
    if not repo.exists():
        init_repo(repo)
    write_files(repo, {benchfmt.BENCH_SCRIPT: script})
    sha = commit_all(repo, "benchmark_serving", "2026-06-24T10:00:00Z")
    return GitRepo(repo), sha


def check(repo: GitRepo, sha: str) -> list[benchfmt.BenchFormat]:
    return benchfmt.check_tree(lambda p: repo.read_blob(sha, p), RECIPE, where=f"ATOM {sha[:10]}")


def test_the_gate_reads_a_result_file_of_exactly_the_pinned_shape(tmp_path: Path) -> None:
    repo, sha = atom_with(tmp_path, SCRIPT)
    (fmt,) = check(repo, sha)
    assert set(benchfmt.GATE_KEYS) | set(benchfmt.PLOT_KEYS) <= fmt.keys
    assert fmt.metrics == ("ttft", "tpot", "itl", "e2el")  # the recipe's --percentile-metrics
    assert fmt.percentiles == ("99",)  # the script's --metric-percentiles default
    assert "mean_{metric_attribute_name}_ms" in fmt.templates
    assert fmt.file_name.endswith("-{current_dt}.json") and "--result-filename" in fmt.flags

    # a --save-result file with exactly those keys (numbers as the recipe's row)
    bench = next(c for c in load_recipe(RECIPE).checks if isinstance(c, BenchmarkCheck))
    row = bench.row(bench.concurrencies[0])
    assert row is not None
    values = {
        "completed": 10 * row.concurrency,
        "duration": 100.0,
        "output_throughput": row.output_throughput,
    }
    values |= {"mean_ttft_ms": row.mean_ttft_ms, "mean_tpot_ms": row.mean_tpot_ms}
    data = {key: values.get(key, 1.0) for key in sorted(fmt.keys)}
    result = evaluate_benchmark(
        bench, row, json.dumps(data), tolerance=bench.tolerance, num_prompts=10 * row.concurrency, name="b"
    )
    assert result.passed, result.message


def test_a_renamed_key_fails_with_what_was_renamed(tmp_path: Path) -> None:
    renamed = SCRIPT.replace('f"mean_{metric_attribute_name}_ms"', 'f"avg_{metric_attribute_name}_ms"')
    assert renamed != SCRIPT
    repo, sha = atom_with(tmp_path, renamed)
    with pytest.raises(benchfmt.FormatError) as exc:
        check(repo, sha)
    msg = str(exc.value)
    assert "key 'mean_ttft_ms' is not written" in msg and "key 'mean_tpot_ms' is not written" in msg
    assert "(renamed to " in msg and "avg_ttft_ms" in msg
    assert f"{benchfmt.BENCH_SCRIPT} at ATOM {sha[:10]}" in msg


def test_a_metric_the_recipe_no_longer_selects_fails(tmp_path: Path) -> None:
    repo, sha = atom_with(tmp_path, SCRIPT)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        RECIPE.read_text().replace("--percentile-metrics=ttft,tpot,itl,e2el", "--percentile-metrics=ttft")
    )
    with pytest.raises(benchfmt.FormatError, match="key 'mean_tpot_ms' is not written"):
        benchfmt.check_tree(lambda p: repo.read_blob(sha, p), recipe, where="ATOM")


def test_a_flag_the_runner_passes_gone_fails(tmp_path: Path) -> None:
    gone = SCRIPT.replace('    p.add_argument("--result-filename")\n', "")
    assert gone != SCRIPT
    repo, sha = atom_with(tmp_path, gone)
    with pytest.raises(benchfmt.FormatError, match="flag --result-filename is gone"):
        check(repo, sha)


def test_render_fails_clearly_when_the_pinned_atom_has_no_benchmark(tmp_path: Path) -> None:
    repos: BuildRepos = make_build_repos(tmp_path / "upstreams", benchmark=False)
    recipe = tmp_path / "recipes" / "MiniMax-M3-MXFP4.yaml"
    recipe.parent.mkdir()
    shutil.copy(RECIPE, recipe)
    with pytest.raises(RenderError) as exc:
        render(repos, tmp_path / "ctx", recipe=recipe)
    assert f"has no {benchfmt.BENCH_SCRIPT}, which recipe MiniMax-M3-MXFP4.yaml runs" in exc.value.message
    assert "benchmark_serving.py" in (exc.value.hint or "")
    assert not (tmp_path / "ctx").exists()  # nothing half-done


def test_the_real_recipes_match_their_checks(tmp_path: Path) -> None:
    """Both recipes' benchmark commands parse and select what the gate reads."""
    repo, sha = atom_with(tmp_path, SCRIPT)
    checked = []
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        fmts = benchfmt.check_tree(lambda p: repo.read_blob(sha, p), recipe, where="ATOM")
        assert all(f.missing(benchfmt.GATE_KEYS) == [] for f in fmts), recipe
        checked += [recipe.name] * len(fmts)
    assert {"MiniMax-M3-MXFP4.yaml", "MiniMax-M3-MXFP8.yaml"} <= set(checked)
