"""The checks: plug-ins with one `run(ctx) -> CheckResult`, and the pure gates they call.

Each recipe check kind has a planner in `PLUGINS` that turns it into plug-ins (the benchmark
gives one per concurrency row); the runner calls `plan()` and then each plug-in's `run(ctx)`
with itself as the `CheckContext`, so a new kind of check is one class and one table entry.
The gates, pure functions from a tool's output to a `CheckResult`:

- chat: the server's ``/v1/chat/completions`` answer must be non-empty, with a
  sane ``finish_reason`` (and match the recipe's regex if it has one);
- gsm8k: lm_eval's own ``results_<timestamp>.json`` against the recipe's
  validated value, with a margin that is honest for the sample count;
- serving benchmark: ``benchmark_serving --save-result`` JSON against the
  recipe's reference row within a relative tolerance.

The gates do no I/O: the plug-ins fetch the tools' files through the context and call them.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.log import Logger
from pipeline.recipes.recipe import BenchmarkCheck, BenchRow, ChatCheck, Gsm8kCheck, Recipe, expand
from pipeline.smoke.running import RunningScore, watch_config
from pipeline.smoke.verdict import CheckResult

IN_CONTAINER_OUT = "/tmp/atom-smoke"


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
        "p99_ttft_ms": _num(data.get("p99_ttft_ms")),  # for the plot; the gate reads the means
        "p99_tpot_ms": _num(data.get("p99_tpot_ms")),
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


# -- plug-ins ---------------------------------------------------------------------------


class CheckContext(Protocol):
    """What a check may use of the smoke run (the runner's `_Run` is one)."""

    recipe: Recipe
    port: int
    run_id: str
    log: Logger
    probe: str  # the in-container probe's source (`python -c`)

    def probe_json(self, *args: str, supervised: float | None = None) -> dict[str, Any]: ...

    def supervised(self, argv: Sequence[str], timeout: float, what: str) -> tuple[int, str] | str: ...

    def exec(self, argv: Sequence[str]) -> tuple[int, str]: ...

    def save(self, name: str, text: str) -> Path: ...

    def tool(self, name: str, argv: Sequence[str], timeout: float) -> tuple[int, str] | CheckResult: ...

    def accuracy_proxy(
        self, config: Mapping[str, Any], metric: str
    ) -> AbstractContextManager[RunningScore | None]: ...


class PlanOptions(Protocol):
    """The per-run choices a planner reads (the runner's frozen `SmokeOptions`)."""

    @property
    def quick(self) -> bool: ...
    @property
    def gsm8k_limit(self) -> int | None: ...
    @property
    def bench_concurrencies(self) -> tuple[int, ...] | None: ...
    @property
    def bench_tolerance(self) -> float | None: ...


class SmokeCheck(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def counts(self) -> tuple[str, int] | None:
        """(request path, how many) the check sends the server, for live progress; None: time only."""

    def run(self, ctx: CheckContext) -> CheckResult: ...

    def recheck(self, result: CheckResult) -> str:
        """Why `result`'s figures do not bear out its pass ("" when they do): what `pipeline tag`
        reads a verdict's passed check by, against the recipe's limits, never the check's own."""


@dataclass(frozen=True)
class ChatGate:
    """One chat completion through the in-container probe, gated by `evaluate_chat`."""

    check: ChatCheck

    @property
    def name(self) -> str:
        return self.check.name

    @property
    def counts(self) -> None:
        return None

    def recheck(self, result: CheckResult) -> str:
        status = result.figures.get("http_status")
        return "" if status == 200 else f"it records HTTP {status!r}, not 200"

    def run(self, ctx: CheckContext) -> CheckResult:
        check = self.check
        body = json.dumps(
            {
                "model": ctx.recipe.model.id,
                "messages": [{"role": "user", "content": check.prompt}],
                "max_tokens": check.max_tokens,
                "temperature": check.temperature,
            }
        )
        url = f"http://127.0.0.1:{ctx.port}/v1/chat/completions"
        start = time.monotonic()
        argv = [ctx.recipe.server.python, "-c", ctx.probe, "http", "POST", url, str(check.timeout_s), body]
        out = ctx.supervised(argv, check.timeout_s + 30, "chat completion")
        seconds = time.monotonic() - start
        if isinstance(out, str):
            return CheckResult.fail(check.name, out, seconds=seconds, limits={"timeout_s": check.timeout_s})
        code, text = out
        try:
            res = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return CheckResult.fail(
                check.name,
                f"chat probe exited {code} without a result",
                evidence=ctx.log.redact(text[-2000:]),
                seconds=seconds,
            )
        ctx.save(f"{check.name}-response.json", str(res.get("body", "")))
        if not res.get("status"):
            return CheckResult.fail(
                check.name,
                f"chat completion failed: {res.get('error')}",
                seconds=seconds,
                limits={"timeout_s": check.timeout_s},
            )
        result = evaluate_chat(
            check, int(res["status"]), str(res.get("body", "")), float(res.get("seconds", seconds))
        )
        result.seconds = seconds
        return result


@dataclass(frozen=True)
class Gsm8kGate:
    """The recipe's lm_eval command in the server container; its results file, gated."""

    check: Gsm8kCheck
    limit: int | None

    @property
    def name(self) -> str:
        return self.check.name

    @property
    def counts(self) -> tuple[str, int]:
        """One request per document (5-shot multi-turn is one chat request)."""
        chat = any("chat-completions" in a for a in self.check.command)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        return path, self.limit or self.check.reference.samples

    def recheck(self, result: CheckResult) -> str:
        value, n = _num(result.figures.get("value")), result.figures.get("samples")
        if value is None or type(n) is not int or n < 1:
            return "it records no value over a number of documents"
        lower, _ = gsm8k_lower_bound(self.check, n)
        if value < round(lower, 4):  # the figure is rounded as the bound is: rounding keeps >=
            return (
                f"its {self.check.metric} {value} over {n} documents is below the recipe's bound {lower:.4f}"
            )
        return ""

    def run(self, ctx: CheckContext) -> CheckResult:
        check, limit = self.check, self.limit
        start = time.monotonic()
        if check.setup:
            setup = ctx.tool(f"{check.name}-setup", check.setup, 1800)
            if isinstance(setup, CheckResult):
                return setup
            if setup[0] != 0:
                return CheckResult.fail(
                    check.name,
                    f"setup {shlex.join(check.setup)} exited {setup[0]}",
                    evidence=ctx.log.redact(setup[1][-3000:]),
                )
        out_dir = f"{IN_CONTAINER_OUT}/{ctx.run_id}/{check.name}"
        # lm_eval scores only at the end: a recording proxy scores each answer as it comes
        config = watch_config(check.command, task=check.task, port=ctx.port)
        with ctx.accuracy_proxy(config, check.metric) if config else _no_proxy() as running:
            port = running.port if running is not None and running.port else ctx.port
            argv = [
                *expand(check.command, {"model": ctx.recipe.model.id, "port": port}),
                "--output_path",
                out_dir,
            ]
            if limit is not None:
                argv += ["--limit", str(limit)]
            ran = ctx.tool(check.name, argv, check.timeout_s)
        if isinstance(ran, CheckResult):
            return ran
        code, text = ran
        seconds = time.monotonic() - start
        if code != 0:
            return CheckResult.fail(
                check.name, f"lm_eval exited {code}", seconds=seconds, evidence=ctx.log.redact(text[-3000:])
            )
        found = ctx.probe_json("newest", out_dir, "results_*.json")
        if not found.get("path"):
            return CheckResult.fail(
                check.name,
                f"lm_eval exited 0 but wrote no results_*.json under {out_dir}",
                seconds=seconds,
                evidence=ctx.log.redact(text[-3000:]),
            )
        ctx.save(f"{check.name}-results.json", str(found["text"]))
        result = evaluate_gsm8k(check, str(found["text"]), limit=limit)
        result.seconds = seconds
        result.figures["results_file"] = str(found["path"])
        if running is not None:
            result.figures.update(running.figures())
            final = result.figures.get("value")
            if running.value() is not None and final is not None and abs(running.value() - final) > 5e-5:
                ctx.log.warn(  # the gate is lm_eval's figure; a disagreement is worth a look
                    f"the running GSM8K score ({running.status()}) disagrees with lm_eval's {final}"
                )
        return result


@dataclass(frozen=True)
class BenchmarkGate:
    """One concurrency row of the serving benchmark; its --save-result file, gated."""

    check: BenchmarkCheck
    concurrency: int
    tolerance: float

    @property
    def name(self) -> str:
        return f"{self.check.name}[c{self.concurrency}]"

    def recheck(self, result: CheckResult) -> str:
        row, t, f = self.check.row(self.concurrency), self.tolerance, result.figures
        got = {k: _num(f.get(k)) for k in BENCH_KEYS}
        if row is None or None in got.values():
            return f"it records no {', '.join(k for k, v in got.items() if v is None) or 'reference row'}"
        num_prompts = self.concurrency * self.check.num_prompts_per_concurrency
        problems = []
        completed = f.get("completed")
        if type(completed) is not int or completed < num_prompts:
            problems.append(f"{completed} of {num_prompts} requests completed")
        # figures and limits rounded alike (to 0.01): rounding keeps >= and <=
        if (got["output_throughput"] or 0) < round(row.output_throughput * (1 - t), 2):
            problems.append(
                f"output {got['output_throughput']} tok/s is below {row.output_throughput} - {t:.0%}"
            )
        if (got["mean_ttft_ms"] or 0) > round(row.mean_ttft_ms * (1 + t), 2):
            problems.append(f"mean TTFT {got['mean_ttft_ms']} ms is above {row.mean_ttft_ms} + {t:.0%}")
        if (got["mean_tpot_ms"] or 0) > round(row.mean_tpot_ms * (1 + t), 2):
            problems.append(f"mean TPOT {got['mean_tpot_ms']} ms is above {row.mean_tpot_ms} + {t:.0%}")
        return "; ".join(problems)

    @property
    def counts(self) -> tuple[str, int]:
        return "/v1/completions", self.concurrency * self.check.num_prompts_per_concurrency

    def run(self, ctx: CheckContext) -> CheckResult:
        check, conc, name = self.check, self.concurrency, self.name
        row = check.row(conc)
        if row is None:
            return CheckResult.fail(
                name,
                f"the recipe has no reference row for ISL {check.isl}/OSL {check.osl} concurrency {conc}",
            )
        num_prompts = conc * check.num_prompts_per_concurrency
        out_dir = f"{IN_CONTAINER_OUT}/{ctx.run_id}/{check.name}"
        filename = f"bench-isl{check.isl}-osl{check.osl}-c{conc}.json"
        start = time.monotonic()
        code, text = ctx.exec(["mkdir", "-p", out_dir])
        if code != 0:
            return CheckResult.fail(name, f"cannot create {out_dir} in the container: {text.strip()}")
        argv = [
            *expand(
                check.command,
                {
                    "model": ctx.recipe.model.id,
                    "port": ctx.port,
                    "isl": check.isl,
                    "osl": check.osl,
                    "concurrency": conc,
                    "num_prompts": num_prompts,
                },
            ),
            f"--result-dir={out_dir}",
            f"--result-filename={filename}",
        ]
        ran = ctx.tool(f"{check.name}-c{conc}", argv, check.timeout_s)
        if isinstance(ran, CheckResult):
            ran.name = name
            return ran
        code, text = ran
        seconds = time.monotonic() - start
        if code != 0:
            return CheckResult.fail(
                name,
                f"benchmark_serving exited {code}",
                seconds=seconds,
                evidence=ctx.log.redact(text[-3000:]),
            )
        found = ctx.probe_json("read", f"{out_dir}/{filename}")
        if not found.get("path"):
            return CheckResult.fail(
                name,
                f"benchmark_serving exited 0 but wrote no {out_dir}/{filename}",
                seconds=seconds,
                evidence=ctx.log.redact(text[-3000:]),
            )
        ctx.save(f"{check.name}-c{conc}.json", str(found["text"]))
        result = evaluate_benchmark(
            check, row, str(found["text"]), tolerance=self.tolerance, num_prompts=num_prompts, name=name
        )
        result.seconds = seconds
        return result


@contextlib.contextmanager
def _no_proxy() -> Iterator[None]:
    yield None


def _plan_chat(check: Any, opts: PlanOptions) -> list[SmokeCheck]:
    return [ChatGate(check)]


def _plan_gsm8k(check: Any, opts: PlanOptions) -> list[SmokeCheck]:
    return [Gsm8kGate(check, opts.gsm8k_limit or (check.quick_limit if opts.quick else check.limit))]


def _plan_benchmark(check: Any, opts: PlanOptions) -> list[SmokeCheck]:
    if opts.bench_concurrencies:
        rows = opts.bench_concurrencies
    elif opts.quick:
        rows = check.quick_concurrencies or check.concurrencies[:1]
    else:
        rows = check.concurrencies
    tolerance = check.tolerance if opts.bench_tolerance is None else opts.bench_tolerance
    return [BenchmarkGate(check, conc, tolerance) for conc in rows]


# recipe check kind -> planner; the one place a new kind of check is registered
PLUGINS: Mapping[str, Callable[[Any, PlanOptions], list[SmokeCheck]]] = {
    "chat": _plan_chat,
    "gsm8k": _plan_gsm8k,
    "serving-benchmark": _plan_benchmark,
}


def plan(recipe: Recipe, opts: PlanOptions) -> list[SmokeCheck]:
    """The recipe's checks as plug-ins, in the recipe's order."""
    return [item for check in recipe.checks for item in PLUGINS[check.kind](check, opts)]
