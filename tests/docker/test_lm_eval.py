"""The GSM8K gate against the real lm_eval (the pinned lm-eval, no stand-in).

The smoke stage runs the recipe's accuracy command in the server container, exactly as on the
GPU host: ``lm_eval --model local-chat-completions ... --tasks gsm8k --num_fewshot 5
--apply_chat_template --fewshot_as_multiturn``, plus ``--include_path`` to a local task that
includes lm_eval's own gsm8k config over generated GSM8K-format documents
(tests/servers/gsm8k_local.py). The test server's ``mixed`` mode answers them right and wrong
in a known proportion, so the score and the stderr the gate reads from lm_eval's own
``results_<timestamp>.json`` are known exactly. Every fault must be a failed gate, never a pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.oci.engine import Engine
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke.checks import evaluate_gsm8k
from tests.docker.conftest import DockerCleanup
from tests.docker.test_smoke import no_container_left, smoke, variant
from tests.servers.gsm8k_local import expected_scores

LIMIT = 40


def test_real_lm_eval_scores_the_known_proportion(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe_path = variant(tmp_path, "mixed", replace={"limit: 60": f"limit: {LIMIT}"})
    verdict, run_dir, _ = smoke(engine, smoke_image, recipe_path, tmp_path, docker_cleanup, run_all=True)

    want = expected_scores(LIMIT)
    flex, flex_se = want["flexible-extract"]
    strict, strict_se = want["strict-match"]
    assert (flex, strict) == (0.75, 0.5)  # 10 wrong, 10 without "#### N", 20 right of 40
    gsm = next(c for c in verdict.checks if c.name == "gsm8k")
    assert gsm.figures["value"] == flex and gsm.figures["samples"] == LIMIT
    assert gsm.figures["stderr"] == pytest.approx(flex_se, rel=1e-9)
    # 0.75 over 40 documents is far below the recipe's 0.9363 ± 0.0067: the gate fails
    assert gsm.status == "failed" and "below the reference 0.9363" in gsm.message
    assert verdict.status == "failed" and not verdict.passed

    # lm_eval's own file, as it wrote it: both filters, their stderr, the sample count, the limit
    results = json.loads((run_dir / "gsm8k-results.json").read_text())
    task = results["results"]["gsm8k"]
    assert task["exact_match,flexible-extract"] == flex
    assert task["exact_match_stderr,flexible-extract"] == pytest.approx(flex_se, rel=1e-9)
    assert task["exact_match,strict-match"] == strict
    assert task["exact_match_stderr,strict-match"] == pytest.approx(strict_se, rel=1e-9)
    assert results["n-samples"]["gsm8k"]["effective"] == LIMIT
    assert results["configs"]["gsm8k"]["num_fewshot"] == 5
    assert gsm.figures["results_file"].split("/")[-1].startswith("results_")

    # the running score, from the recording proxy lm_eval talked through, ends where lm_eval did
    assert gsm.figures["running_scored"] == LIMIT and gsm.figures["running_unmatched"] == 0
    assert gsm.figures["running_value"] == flex
    assert gsm.figures["running_correct"] == {
        "exact_match,flexible-extract": flex * LIMIT,
        "exact_match,strict-match": strict * LIMIT,
    }
    lm_eval_log = (run_dir / "gsm8k.log").read_text()
    assert "base_url=http://127.0.0.1:8000/" not in lm_eval_log  # it went through the proxy

    # the same real file passes a gate whose reference it meets, on either filter
    check = load_recipe(recipe_path).checks[1]
    for metric, value in (("exact_match,flexible-extract", flex), ("exact_match,strict-match", strict)):
        met = check.model_copy(
            update={
                "metric": metric,
                "reference": check.reference.model_copy(update={"value": value, "stderr": 0.0}),  # type: ignore[union-attr]
            }
        )
        r = evaluate_gsm8k(met, json.dumps(results), limit=LIMIT)  # type: ignore[arg-type]
        assert r.passed and r.figures["value"] == value, r.message
    no_container_left(engine, docker_cleanup)


def test_lm_eval_losing_its_server_mid_run_fails_the_gate(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe_path = variant(tmp_path, "die-mid-gsm8k")
    verdict, _, _ = smoke(engine, smoke_image, recipe_path, tmp_path, docker_cleanup)
    assert verdict.status == "failed" and not verdict.passed
    gsm = next(c for c in verdict.checks if c.name == "gsm8k")
    assert gsm.status == "failed"
    assert gsm.message.startswith("torch.OutOfMemoryError: HIP out of memory")  # the server's last words
    assert verdict.reason == gsm.message
    assert verdict.checks[-1].status == "skipped"
    no_container_left(engine, docker_cleanup)


def test_lm_eval_writing_no_results_file_fails_the_gate(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    # `lm_eval --help ...` is the real tool exiting 0 without evaluating anything
    recipe_path = variant(tmp_path, replace={"      - lm_eval\n": "      - lm_eval\n      - --help\n"})
    verdict, _, _ = smoke(engine, smoke_image, recipe_path, tmp_path, docker_cleanup)
    gsm = next(c for c in verdict.checks if c.name == "gsm8k")
    assert gsm.status == "failed" and "exited 0 but wrote no results_*.json" in gsm.message
    assert verdict.status == "failed" and not verdict.passed
    no_container_left(engine, docker_cleanup)


@pytest.mark.parametrize(
    ("replace", "expect"),
    [
        ({"      - --tasks\n      - gsm8k\n": "      - --tasks\n      - arith\n"}, "no results.gsm8k entry"),
        ({"metric: exact_match,flexible-extract": "metric: acc,none"}, "has no numeric 'acc,none'"),
    ],
    ids=["another-task", "another-metric"],
)
def test_a_results_file_for_another_task_or_metric_fails_the_gate(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    replace: dict[str, str],
    expect: str,
) -> None:
    recipe_path = variant(tmp_path, replace={"limit: 60": "limit: 8", **replace})
    verdict, run_dir, _ = smoke(engine, smoke_image, recipe_path, tmp_path, docker_cleanup)
    gsm = next(c for c in verdict.checks if c.name == "gsm8k")
    assert gsm.status == "failed" and expect in gsm.message, gsm.message
    assert verdict.status == "failed" and not verdict.passed
    assert json.loads((run_dir / "gsm8k-results.json").read_text())["results"]  # lm_eval did write one
    no_container_left(engine, docker_cleanup)
