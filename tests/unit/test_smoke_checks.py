import json
import math
from pathlib import Path

import pytest

from pipeline.recipes.recipe import BenchmarkCheck, ChatCheck, Gsm8kCheck, load_recipe
from pipeline.smoke.checks import (
    PLUGINS,
    BenchmarkGate,
    ChatGate,
    Gsm8kGate,
    evaluate_benchmark,
    evaluate_chat,
    evaluate_gsm8k,
    gsm8k_lower_bound,
    plan,
    stderr_key,
)
from pipeline.smoke.runner import SmokeOptions

REPO = Path(__file__).resolve().parents[2]
RECIPE = load_recipe(REPO / "recipes" / "MiniMax-M3-MXFP4.yaml")
CHAT, GSM, BENCH = RECIPE.checks
assert isinstance(CHAT, ChatCheck) and isinstance(GSM, Gsm8kCheck) and isinstance(BENCH, BenchmarkCheck)


def lm_eval_results(
    value: float, *, n: int = 1319, limit: float | None = None, stderr: float = 0.0067
) -> str:
    """A results_<timestamp>.json as lm_eval 0.4 writes it (abridged to the keys that matter)."""
    return json.dumps(
        {
            "results": {
                "gsm8k": {
                    "alias": "gsm8k",
                    "exact_match,strict-match": value,
                    "exact_match_stderr,strict-match": stderr,
                    "exact_match,flexible-extract": value,
                    "exact_match_stderr,flexible-extract": stderr,
                }
            },
            "group_subtasks": {"gsm8k": []},
            "versions": {"gsm8k": 3.0},
            "n-shot": {"gsm8k": 5},
            "n-samples": {"gsm8k": {"original": 1319, "effective": n}},
            "config": {"model": "local-chat-completions", "limit": limit, "batch_size": "65"},
            "model_name": "amd/MiniMax-M3-MXFP4",
            "model_name_sanitized": "amd__MiniMax-M3-MXFP4",
        }
    )


def test_gsm8k_full_run_at_the_reference_passes() -> None:
    r = evaluate_gsm8k(GSM, lm_eval_results(0.9363), limit=None)
    assert r.passed and r.figures["value"] == 0.9363 and r.figures["samples"] == 1319
    assert r.limits["reference"] == 0.9363 and r.limits["min_value"] < 0.9363


def test_gsm8k_regression_fails_with_the_figures() -> None:
    r = evaluate_gsm8k(GSM, lm_eval_results(0.85), limit=None)
    assert not r.passed and r.status == "failed"
    assert "0.8500 over 1319 documents < 0.9" in r.message and "0.9363 ± 0.0067" in r.message


def test_gsm8k_margin_is_honest_for_the_sample_count() -> None:
    full_lower, full_margin = gsm8k_lower_bound(GSM, 1319)
    quick_lower, quick_margin = gsm8k_lower_bound(GSM, 250)
    p = 0.9363
    assert full_margin == pytest.approx(3 * math.sqrt(0.0067**2 + p * (1 - p) / 1319))
    assert quick_margin == pytest.approx(3 * math.sqrt(0.0067**2 + p * (1 - p) / 250))
    assert quick_margin > full_margin  # fewer documents, wider margin
    # 0.89 over 250 documents is within noise; over the full split it is a regression
    assert evaluate_gsm8k(GSM, lm_eval_results(0.89, n=250, limit=250.0), limit=250).passed
    assert not evaluate_gsm8k(GSM, lm_eval_results(0.89), limit=None).passed
    assert quick_lower < 0.89 < full_lower


def test_gsm8k_reads_n_from_the_file_and_checks_the_limit() -> None:
    r = evaluate_gsm8k(GSM, lm_eval_results(1.0, n=40, limit=40.0), limit=40)
    assert r.passed and r.figures["samples"] == 40
    wrong = evaluate_gsm8k(GSM, lm_eval_results(1.0, n=1319, limit=None), limit=40)
    assert not wrong.passed and "limit None, not the 40" in wrong.message


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("not json", "no results.gsm8k entry"),
        (json.dumps({"results": {"mmlu": {}}}), "no results.gsm8k entry"),
        (json.dumps({"results": {"gsm8k": {"exact_match,strict-match": 0.9}}}), "no numeric"),
        (json.dumps({"results": {"gsm8k": {"exact_match,flexible-extract": "N/A"}}}), "no numeric"),
    ],
)
def test_gsm8k_malformed_results_fail(text: str, expect: str) -> None:
    r = evaluate_gsm8k(GSM, text, limit=None)
    assert not r.passed and expect in r.message


def test_stderr_key() -> None:
    assert stderr_key("exact_match,flexible-extract") == "exact_match_stderr,flexible-extract"
    assert stderr_key("acc") == "acc_stderr"


def bench_result(thr: float = 1280.0, ttft: float = 380.0, tpot: float = 11.7, completed: int = 160) -> str:
    """benchmark_serving --save-result JSON (keys as atom/benchmarks/benchmark_serving.py writes them)."""
    return json.dumps(
        {
            "date": "20260624-153600",
            "backend": "vllm",
            "model_id": "amd/MiniMax-M3-MXFP4",
            "tokenizer_id": "amd/MiniMax-M3-MXFP4",
            "best_of": 1,
            "num_prompts": 160,
            "request_rate": "inf",
            "burstiness": 1.0,
            "max_concurrency": 16,
            "duration": 114.0,
            "completed": completed,
            "total_input_tokens": 1_200_000,
            "total_output_tokens": 146_000,
            "request_throughput": 1.4,
            "request_goodput:": None,
            "output_throughput": thr,
            "total_token_throughput": 11500.0,
            "mean_ttft_ms": ttft,
            "median_ttft_ms": ttft,
            "std_ttft_ms": 10.0,
            "p99_ttft_ms": 2200.0,
            "mean_tpot_ms": tpot,
            "median_tpot_ms": tpot,
            "std_tpot_ms": 1.0,
            "p99_tpot_ms": 12.8,
        }
    )


def _bench(text: str, tolerance: float = 0.10):  # type: ignore[no-untyped-def]
    row = BENCH.row(16)
    assert row is not None
    return evaluate_benchmark(
        BENCH, row, text, tolerance=tolerance, num_prompts=160, name="serving-benchmark[c16]"
    )


def test_benchmark_within_tolerance_passes() -> None:
    r = _bench(bench_result())
    assert r.passed and r.figures["output_throughput"] == 1280.0
    assert r.limits["min_output_throughput"] == pytest.approx(1152.42)
    assert r.limits["max_mean_ttft_ms"] == pytest.approx(421.34)
    assert r.limits["max_mean_tpot_ms"] == pytest.approx(12.9)


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"thr": 1100.0}, "output 1100.0 tok/s < 1152.42"),
        ({"ttft": 450.0}, "mean TTFT 450.0 ms > 421.34"),
        ({"tpot": 13.5}, "mean TPOT 13.50 ms > 12.9"),
        ({"completed": 150}, "only 150 of 160 requests completed"),
    ],
)
def test_benchmark_gate_failures(kwargs: dict[str, float], expect: str) -> None:
    r = _bench(bench_result(**kwargs))  # type: ignore[arg-type]
    assert not r.passed and expect in r.message, r.message


def test_benchmark_tolerance_is_configurable_and_keys_are_required() -> None:
    assert _bench(bench_result(thr=1100.0), tolerance=0.2).passed
    broken = json.loads(bench_result())
    del broken["mean_tpot_ms"]
    r = _bench(json.dumps(broken))
    assert not r.passed and "no numeric mean_tpot_ms" in r.message
    assert not _bench("[]").passed


def chat_body(content: str | None, finish: str | None = "stop", **message: str) -> str:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, **message},
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3},
        }
    )


def test_chat_answer_passes() -> None:
    r = evaluate_chat(CHAT, 200, chat_body("Paris."), 0.5)
    assert r.passed and r.figures["finish_reason"] == "stop" and r.figures["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("status", "body", "expect"),
    [
        (500, "boom", "HTTP 500"),
        (200, "{}", "not an OpenAI chat.completion"),
        (200, chat_body(""), "empty answer"),
        (200, chat_body(None, reasoning_content="thinking..."), "only reasoning"),
        (200, chat_body("Paris.", finish="abort"), "finish_reason 'abort' is not one of stop, length, eos"),
        (200, chat_body("Paris.", finish=None), "finish_reason None"),
        (200, chat_body("London."), "does not match"),
    ],
)
def test_chat_failures(status: int, body: str, expect: str) -> None:
    r = evaluate_chat(CHAT, status, body, 0.1)
    assert not r.passed and expect in r.message, r.message


@pytest.mark.parametrize("finish", ["eos", "stop_200020", "max_tokens", "stop_sequence", "stop", "length"])
def test_chat_accepts_atoms_own_finish_reasons(finish: str) -> None:
    # atom/model_engine/scheduler.py at ab9eb781 passes its leave_reason through as finish_reason
    assert evaluate_chat(CHAT, 200, chat_body("Paris.", finish=finish), 0.1).passed


@pytest.mark.parametrize("finish", ["unschedulable: prompt too long", "stop_", "eos2", "abort"])
def test_chat_rejects_other_finish_reasons(finish: str) -> None:
    assert not evaluate_chat(CHAT, 200, chat_body("Paris.", finish=finish), 0.1).passed


# -- plug-ins ---------------------------------------------------------------------------


def test_every_recipe_check_kind_has_a_plug_in() -> None:
    kinds = {c.model_fields["kind"].annotation.__args__[0] for c in (ChatCheck, Gsm8kCheck, BenchmarkCheck)}
    assert set(PLUGINS) == kinds


def test_plan_turns_the_recipe_into_plug_ins_in_order() -> None:
    full = plan(RECIPE, SmokeOptions())
    assert [c.name for c in full] == ["chat", "gsm8k", "serving-benchmark[c16]"]
    assert isinstance(full[0], ChatGate) and isinstance(full[1], Gsm8kGate)
    assert full[1].limit is None  # the recipe's full run: the whole split
    quick = plan(RECIPE, SmokeOptions(quick=True, bench_concurrencies=(4, 16), bench_tolerance=0.3))
    gsm, *rows = quick[1:]
    assert isinstance(gsm, Gsm8kGate) and gsm.limit == GSM.quick_limit
    assert [(r.name, r.tolerance) for r in rows if isinstance(r, BenchmarkGate)] == [
        ("serving-benchmark[c4]", 0.3),
        ("serving-benchmark[c16]", 0.3),
    ]
    assert plan(RECIPE, SmokeOptions(gsm8k_limit=7))[1].limit == 7  # type: ignore[attr-defined]
