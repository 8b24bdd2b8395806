"""The gates: pure functions from a tool's output to a `CheckResult`.

- chat: the server's ``/v1/chat/completions`` answer must be non-empty, with a
  sane ``finish_reason`` (and match the recipe's regex if it has one);
- gsm8k: lm_eval's own ``results_<timestamp>.json`` against the recipe's
  validated value, with a margin that is honest for the sample count;
- serving benchmark: ``benchmark_serving --save-result`` JSON against the
  recipe's reference row within a relative tolerance.

No I/O here: the runner fetches the files and calls these.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pipeline.recipe import BenchmarkCheck, BenchRow, ChatCheck, Gsm8kCheck
from pipeline.smoke.verdict import CheckResult


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


# -- chat -----------------------------------------------------------------------------


def evaluate_chat(check: ChatCheck, status: int, body: str, seconds: float) -> CheckResult:
    limits: dict[str, Any] = {"finish_reasons": list(check.finish_reasons), "timeout_s": check.timeout_s}
    if check.expect_regex:
        limits["expect_regex"] = check.expect_regex
    figures: dict[str, Any] = {"http_status": status, "latency_s": round(seconds, 3)}
    if status != 200:
        return CheckResult.fail(
            check.name,
            f"chat completion returned HTTP {status}: {body[:300]}",
            figures=figures,
            limits=limits,
        )
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return CheckResult.fail(
            check.name,
            f"chat completion is not an OpenAI chat.completion object: {body[:300]}",
            figures=figures,
            limits=limits,
        )
    if not isinstance(content, str):
        content = str(content)
    usage = data.get("usage") if isinstance(data, dict) else None
    figures.update(
        finish_reason=finish,
        content_chars=len(content),
        completion_tokens=(usage or {}).get("completion_tokens") if isinstance(usage, dict) else None,
        answer=content.strip()[:200],
    )
    if not content.strip():
        extra = (
            " (the model returned only reasoning: raise max_tokens)"
            if message.get("reasoning_content")
            else ""
        )
        return CheckResult.fail(
            check.name, f"chat completion returned an empty answer{extra}", figures=figures, limits=limits
        )
    if not isinstance(finish, str) or not any(re.fullmatch(p, finish) for p in check.finish_reasons):
        return CheckResult.fail(
            check.name,
            f"chat completion finish_reason {finish!r} is not one of {', '.join(check.finish_reasons)}",
            figures=figures,
            limits=limits,
        )
    if check.expect_regex and not re.search(check.expect_regex, content):
        return CheckResult.fail(
            check.name,
            f"chat answer {content.strip()[:120]!r} does not match {check.expect_regex!r}",
            figures=figures,
            limits=limits,
        )
    return CheckResult.ok(
        check.name,
        f"answered {content.strip()[:60]!r} (finish_reason {finish})",
        figures=figures,
        limits=limits,
    )


# -- gsm8k ----------------------------------------------------------------------------


def stderr_key(metric: str) -> str:
    """'exact_match,flexible-extract' -> 'exact_match_stderr,flexible-extract' (lm_eval's naming)."""
    name, _, filt = metric.partition(",")
    return f"{name}_stderr,{filt}" if filt else f"{name}_stderr"


def gsm8k_lower_bound(check: Gsm8kCheck, n: int) -> tuple[float, float]:
    """(lower bound, margin) for a run over `n` documents.

    The measured accuracy over n documents has a binomial standard error
    sqrt(p(1-p)/n) around the true accuracy p (taken as the recipe's value, so a
    broken run cannot widen its own margin); the reference itself carries its
    reported stderr. The gate is one-sided (only a drop fails):
        value >= p - z * sqrt(stderr_ref^2 + p(1-p)/n)
    """
    p = check.reference.value
    se = math.sqrt(check.reference.stderr**2 + p * (1 - p) / n)
    margin = check.z * se
    return p - margin, margin


def evaluate_gsm8k(check: Gsm8kCheck, results_text: str, *, limit: int | None) -> CheckResult:
    ref = check.reference
    try:
        data = json.loads(results_text)
        task = data["results"][check.task]
    except (ValueError, KeyError, TypeError):
        return CheckResult.fail(
            check.name,
            f"lm_eval's results file has no results.{check.task} entry",
            evidence=results_text[:2000],
        )
    value = _num(task.get(check.metric)) if isinstance(task, dict) else None
    if value is None:
        return CheckResult.fail(
            check.name,
            f"lm_eval's results.{check.task} has no numeric {check.metric!r}",
            evidence=json.dumps(task)[:2000],
        )
    stderr = _num(task.get(stderr_key(check.metric)))
    n_samples = None
    ns = data.get("n-samples", {}).get(check.task) if isinstance(data.get("n-samples"), dict) else None
    if isinstance(ns, dict):
        n_samples = ns.get("effective")
    n = int(n_samples) if isinstance(n_samples, int) and n_samples > 0 else (limit or ref.samples)
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    has_limit, file_limit = "limit" in config, config.get("limit")
    lower, margin = gsm8k_lower_bound(check, n)
    figures = {
        "value": round(value, 4),
        "stderr": stderr,
        "samples": n,
        "limit": limit,
        "metric": check.metric,
    }
    limits = {
        "min_value": round(lower, 4),
        "reference": ref.value,
        "reference_stderr": ref.stderr,
        "reference_samples": ref.samples,
        "z": check.z,
        "margin": round(margin, 4),
    }
    if has_limit and file_limit != limit:  # 40 == 40.0; lm_eval stores --limit as a float
        return CheckResult.fail(
            check.name,
            f"lm_eval ran with limit {file_limit}, not the {limit} asked for",
            figures=figures,
            limits=limits,
        )
    desc = f"{check.task} {check.metric} {value:.4f} over {n} documents"
    if value >= lower:
        return CheckResult.ok(
            check.name,
            f"{desc} >= {lower:.4f} (reference {ref.value} ± {ref.stderr}, z={check.z})",
            figures=figures,
            limits=limits,
        )
    return CheckResult.fail(
        check.name,
        f"{desc} < {lower:.4f}: below the reference {ref.value} ± {ref.stderr} (z={check.z})",
        figures=figures,
        limits=limits,
    )


# -- serving benchmark ------------------------------------------------------------------

BENCH_KEYS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")


def evaluate_benchmark(
    check: BenchmarkCheck, row: BenchRow, result_text: str, *, tolerance: float, num_prompts: int, name: str
) -> CheckResult:
    try:
        data = json.loads(result_text)
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        return CheckResult.fail(
            name, "benchmark_serving's result file is not a JSON object", evidence=result_text[:2000]
        )
    got = {k: _num(data.get(k)) for k in BENCH_KEYS}
    missing = [k for k, v in got.items() if v is None]
    if missing:
        return CheckResult.fail(
            name,
            f"benchmark_serving's result has no numeric {', '.join(missing)}",
            evidence=result_text[:2000],
        )
    thr, ttft, tpot = got["output_throughput"], got["mean_ttft_ms"], got["mean_tpot_ms"]
    assert thr is not None and ttft is not None and tpot is not None
    completed = data.get("completed")
    figures: dict[str, Any] = {
        "concurrency": row.concurrency,
        "isl": row.isl,
        "osl": row.osl,
        "output_throughput": round(thr, 2),
        "mean_ttft_ms": round(ttft, 2),
        "mean_tpot_ms": round(tpot, 2),
        "completed": completed,
        "num_prompts": num_prompts,
        "duration_s": _num(data.get("duration")),
    }
    min_thr = row.output_throughput * (1 - tolerance)
    max_ttft = row.mean_ttft_ms * (1 + tolerance)
    max_tpot = row.mean_tpot_ms * (1 + tolerance)
    limits: dict[str, Any] = {
        "tolerance": tolerance,
        "min_output_throughput": round(row.output_throughput * (1 - tolerance), 2),
        "max_mean_ttft_ms": round(row.mean_ttft_ms * (1 + tolerance), 2),
        "max_mean_tpot_ms": round(row.mean_tpot_ms * (1 + tolerance), 2),
        "reference": {k: getattr(row, k) for k in BENCH_KEYS},
    }
    problems = []
    if not isinstance(completed, int) or completed < num_prompts:
        problems.append(f"only {completed} of {num_prompts} requests completed")
    if thr < min_thr:
        problems.append(
            f"output {thr:.1f} tok/s < {limits['min_output_throughput']} (reference {row.output_throughput})"
        )
    if ttft > max_ttft:
        problems.append(
            f"mean TTFT {ttft:.1f} ms > {limits['max_mean_ttft_ms']} (reference {row.mean_ttft_ms})"
        )
    if tpot > max_tpot:
        problems.append(
            f"mean TPOT {tpot:.2f} ms > {limits['max_mean_tpot_ms']} (reference {row.mean_tpot_ms})"
        )
    head = f"ISL {row.isl}/OSL {row.osl} concurrency {row.concurrency}"
    if problems:
        return CheckResult.fail(
            name,
            f"{head}: " + "; ".join(problems) + f" (tolerance {tolerance:.0%})",
            figures=figures,
            limits=limits,
        )
    return CheckResult.ok(
        name,
        f"{head}: {thr:.1f} tok/s, TTFT {ttft:.1f} ms, TPOT {tpot:.2f} ms "
        f"within {tolerance:.0%} of the reference",
        figures=figures,
        limits=limits,
    )
