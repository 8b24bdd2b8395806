"""benchmark.svg's data: a failing row is reported as failing (the SVG itself, drawn by matplotlib,
which starts fc-list, is checked in the docker tier: tests/docker/test_smoke.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline.log import Logger
from pipeline.recipes.recipe import BenchmarkCheck, load_recipe
from pipeline.smoke import plot
from pipeline.smoke.checks import evaluate_benchmark
from pipeline.smoke.verdict import CheckResult, RecipeRef, TestedImage, Verdict
from tests.unit.test_smoke_checks import bench_result

REPO = Path(__file__).resolve().parents[2]
RECIPE = load_recipe(REPO / "recipes" / "MiniMax-M3-MXFP4.yaml")
BENCH = next(c for c in RECIPE.checks if isinstance(c, BenchmarkCheck))


def bench_row(conc: int, *, slow: bool = False) -> CheckResult:
    row = BENCH.row(conc)
    assert row is not None
    text = bench_result(
        thr=row.output_throughput * (0.5 if slow else 1.0),
        ttft=row.mean_ttft_ms,
        tpot=row.mean_tpot_ms * (2 if slow else 1),
        completed=10 * conc,
    )
    return evaluate_benchmark(
        BENCH, row, text, tolerance=BENCH.tolerance, num_prompts=10 * conc, name=f"serving-benchmark[c{conc}]"
    )


def verdict(checks: list[CheckResult]) -> Verdict:
    failed = next((c for c in checks if not c.passed), None)
    return Verdict(
        status="failed" if failed else "passed",
        passed=failed is None,
        reason=failed.message if failed else "all passed",
        image=TestedImage(ref="x:1", id="sha256:" + "1" * 64),
        recipe=RecipeRef(name=RECIPE.name, path="recipes/MiniMax-M3-MXFP4.yaml", sha256="0" * 64),
        checks=[CheckResult.ok("chat", "ok"), *checks],
        started="2026-06-24T00:00:00Z",
        finished="2026-06-24T01:00:00Z",
        tool_version="0",
    )


def test_the_plot_shows_a_failing_row_as_failing(tmp_path: Path) -> None:
    v = verdict([bench_row(8), bench_row(16, slow=True)])
    data = plot.plot_data(v, RECIPE)
    assert data is not None
    assert [(r.concurrency, r.status) for r in data.rows] == [(8, "passed"), (16, "failed")]
    assert data.failed == (16,) and data.tolerance == BENCH.tolerance
    assert [r["concurrency"] for r in data.reference] == [4, 8, 16, 32, 64]  # the recipe's table
    assert data.rows[1].p99_tpot_ms == 12.8  # from the --save-result file, for the p99 curve


def test_without_the_plot_extra_the_stage_says_so_and_draws_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plot, "available", lambda: False)
    out = io.StringIO()
    assert plot.write_for(verdict([bench_row(16)]), RECIPE, tmp_path, Logger(stream=out)) is None
    assert not (tmp_path / plot.PLOT_FILE).exists()
    assert "install the `plot` extra" in out.getvalue()
