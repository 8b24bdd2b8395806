"""What ATOM's ``benchmark_serving.py --save-result`` writes, read statically from the pinned tree.

The serving-benchmark gate parses the JSON that script writes on the GPU host. Render reads the
script from the pinned (patched) ATOM commit -- never executed, like the compat check -- and
fails when a key the gate reads is gone or renamed, or when the script no longer takes the
``--result-dir``/``--result-filename`` flags the runner passes: a recipe cannot drift silently
from the tool.

The script is vLLM's: a literal ``result = {...}`` of totals and throughputs, per-metric keys
written by a helper ``process_one_metric("ttft", ...)`` as ``f"mean_{metric_attribute_name}_ms"``,
``f"p{p_word}_{metric_attribute_name}_ms"`` (for the metrics in ``--percentile-metrics`` and the
percentiles in ``--metric-percentiles``), run metadata as ``result_json["date"] = ...``, and the
file name ``f"{backend}-{args.request_rate}qps...-{current_dt}.json"`` unless
``--result-filename`` is given. The reader resolves those f-strings from the helper's call sites
and the flags' defaults (or the recipe's own flags).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_SCRIPT = "atom/benchmarks/benchmark_serving.py"
BENCH_MODULE = "atom.benchmarks.benchmark_serving"
# What the gate reads (pipeline.smoke.checks) and the flags the runner adds.
GATE_KEYS = ("completed", "duration", "output_throughput", "mean_ttft_ms", "mean_tpot_ms")
PLOT_KEYS = ("p99_ttft_ms", "p99_tpot_ms")
RUNNER_FLAGS = ("--save-result", "--result-dir", "--result-filename")


class FormatError(Exception):
    """The script's --save-result output lacks what the gate needs (the message says what)."""


@dataclass(frozen=True)
class BenchFormat:
    """The keys one ``--save-result`` run writes, for the given command-line flags."""

    keys: frozenset[str]
    templates: tuple[str, ...]  # the per-metric key patterns, e.g. "mean_{metric}_ms"
    metrics: tuple[str, ...]  # metrics selected (--percentile-metrics)
    percentiles: tuple[str, ...]  # as they appear in keys: "99", "99.9"
    flags: dict[str, str | None] = field(default_factory=dict)  # flag -> default (as source text)
    file_name: str = ""  # the default file-name pattern, "{backend}-...json"

    def missing(self, wanted: Sequence[str]) -> list[str]:
        return [k for k in wanted if k not in self.keys]


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _pattern(node: ast.JoinedStr) -> tuple[str, list[str]]:
    """f"mean_{metric_attribute_name}_ms" -> ("mean_{0}_ms", ["metric_attribute_name"])."""
    out, names = [], []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value).replace("{", "{{").replace("}", "}}"))
        elif isinstance(part, ast.FormattedValue):
            names.append(ast.unparse(part.value))
            out.append(f"{{{len(names) - 1}}}")
    return "".join(out), names


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _p_word(p: str) -> str:
    value = float(p)
    return str(int(value)) if int(value) == value else str(value)


class _Reader(ast.NodeVisitor):
    def __init__(self) -> None:
        self.literal: set[str] = set()
        self.templates: list[tuple[str, list[str], str | None]] = []  # pattern, names, enclosing def
        self.params: dict[str, list[str]] = {}  # def name -> parameter names
        self.calls: dict[str, list[list[str | None]]] = {}  # def name -> constant positional args
        self.flags: dict[str, str | None] = {}
        self.file_names: list[str] = []
        self.result_vars = {"result", "result_json", "benchmark_result"}
        self._def: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.params[node.name] = [a.arg for a in node.args.args]
        self._def.append(node.name)
        self.generic_visit(node)
        self._def.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if (
                isinstance(target, ast.Name)
                and target.id in self.result_vars
                and isinstance(node.value, ast.Dict)
            ):
                self.literal.update(k for k in map(_const_str, node.value.keys) if k is not None)
            if (
                isinstance(target, ast.Name)
                and target.id == "file_name"
                and isinstance(node.value, ast.JoinedStr)
            ):
                pattern, names = _pattern(node.value)
                self.file_names.append(pattern.format(*(f"{{{n}}}" for n in names)))
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id in self.result_vars
            ):
                key = _const_str(target.slice)
                if key is not None:
                    self.literal.add(key)
                elif isinstance(target.slice, ast.JoinedStr):
                    pattern, names = _pattern(target.slice)
                    self.templates.append((pattern, names, self._def[-1] if self._def else None))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if (
            isinstance(node.target, ast.Name)
            and node.target.id in self.result_vars
            and isinstance(node.value, ast.Dict)
        ):
            self.literal.update(k for k in map(_const_str, node.value.keys) if k is not None)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            self.calls.setdefault(func.id, []).append([_const_str(a) for a in node.args])
        if isinstance(func, ast.Attribute) and func.attr == "add_argument" and node.args:
            flag = _const_str(node.args[0])
            if flag is not None and flag.startswith("--"):
                default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
                self.flags[flag] = _const_str(default) if default is not None else None
        self.generic_visit(node)


def read_format(source: str, command: Sequence[str] = (), *, path: str = BENCH_SCRIPT) -> BenchFormat:
    """The keys `source` (the script's text) writes when run with `command`'s flags."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise FormatError(f"{path} does not parse as Python (line {e.lineno}: {e.msg})") from None
    r = _Reader()
    r.visit(tree)
    metrics_arg = _flag_value(command, "--percentile-metrics") or r.flags.get("--percentile-metrics") or ""
    selected = [m.strip() for m in metrics_arg.split(",") if m.strip()]
    pct_arg = _flag_value(command, "--metric-percentiles") or r.flags.get("--metric-percentiles") or ""
    percentiles = [_p_word(p) for p in pct_arg.split(",") if p.strip()]
    keys = set(r.literal)
    templates: list[str] = []
    for pattern, names, owner in r.templates:
        values: list[list[str]] = []
        for name in names:
            params = r.params.get(owner or "", [])
            if name in params:  # a parameter: the constants its call sites pass, if selected
                i = params.index(name)
                passed = {c[i] for c in r.calls.get(owner or "", []) if i < len(c) and c[i] is not None}
                values.append(sorted(v for v in passed if v is not None and (not selected or v in selected)))
            elif name.startswith("p") or "percentile" in name:  # p_word: from --metric-percentiles
                values.append(percentiles)
            else:
                values = []
                break
        shown = pattern.format(*(f"{{{n}}}" for n in names))
        templates.append(shown)
        if len(values) != len(names):
            continue
        combos: list[list[str]] = [[]]
        for vs in values:
            combos = [[*c, v] for c in combos for v in vs]
        keys.update(pattern.format(*c) for c in combos)
    return BenchFormat(
        keys=frozenset(keys),
        templates=tuple(templates),
        metrics=tuple(selected),
        percentiles=tuple(percentiles),
        flags=dict(r.flags),
        file_name=r.file_names[-1] if r.file_names else "",
    )


def check_format(fmt: BenchFormat, *, what: str) -> None:
    """Raise FormatError when the gate's keys or the runner's flags are gone from `fmt`."""
    problems = []
    for key in fmt.missing(GATE_KEYS):
        near = difflib.get_close_matches(key, sorted(fmt.keys), n=1, cutoff=0.7)
        problems.append(f"key {key!r} is not written" + (f" (renamed to {near[0]!r}?)" if near else ""))
    for flag in RUNNER_FLAGS:
        if flag not in fmt.flags:
            problems.append(f"flag {flag} is gone")
    if problems:
        raise FormatError(
            f"{what} no longer writes what the serving-benchmark gate reads: " + "; ".join(problems) + ". "
            f"It writes {', '.join(sorted(fmt.keys)) or 'no key we can read'}."
        )


def runs_atom_benchmark(command: Sequence[str]) -> bool:
    """True when a recipe's benchmark command is ATOM's benchmark_serving (module or script path)."""
    return BENCH_MODULE in command or any(a.endswith(BENCH_SCRIPT) for a in command)


def script_path(command: Sequence[str]) -> str:
    return next((a for a in command if a.endswith(BENCH_SCRIPT)), BENCH_SCRIPT)


def check_tree(
    read_blob: Callable[[str], bytes | None], recipe_path: Path, *, where: str
) -> list[BenchFormat]:
    """Check every serving-benchmark of the recipe that runs ATOM's script against `read_blob`'s tree.

    `read_blob(path)` returns a file of the pinned tree (None when absent). Recipes whose
    benchmark is not ATOM's script (test recipes) have nothing to check. Raises FormatError.
    """
    from pipeline.errors import PipelineError
    from pipeline.fsutil import read_text
    from pipeline.recipes.recipe import load_yaml

    try:  # bounded, without aliases: the recipe's own reader
        data: Any = load_yaml(read_text(recipe_path, what="recipe"), recipe_path)
    except PipelineError:
        return []  # the recipe's own validation reports it
    checks = data.get("checks") if isinstance(data, dict) else None
    out: list[BenchFormat] = []
    for check in checks if isinstance(checks, list) else []:
        if not isinstance(check, dict) or check.get("kind") != "serving-benchmark":
            continue
        command = [str(a) for a in check.get("command") or []]
        if not runs_atom_benchmark(command):
            continue
        path = script_path(command).removeprefix("/app/ATOM/")
        blob = read_blob(path)
        what = f"{path} at {where}"
        if blob is None:
            raise FormatError(
                f"{where} has no {path}, which recipe {recipe_path.name} runs as its serving benchmark."
            )
        fmt = read_format(blob.decode("utf-8", errors="replace"), command, path=path)
        check_format(fmt, what=what)
        out.append(fmt)
    return out
