"""Upstream's markdown recipes (ATOM `recipes/<Name>.md`) as our YAML recipes, and their drift.

`parse_markdown` reads one upstream recipe: its headings, the fenced shell blocks
that launch `atom.entrypoints.openai_server` (variables such as `model_path=${model_path:-X}`
and `TP=4`, `export`ed environment, `2>&1 | tee log`, a trailing `&`), the `lm_eval`
block and its "Validated ... result" table, the `benchmark_serving` block and its
reference table. Each MI355 variant (a server block under a heading that names MI355)
becomes one `Variant`; `render_yaml` writes it as a recipe the schema validates, with a
`source:` line (file @ SHA) and a comment on every field it had to infer. What it
cannot read is a `RecipeParseError` naming the markdown line, never a guess.

Drift (pipeline.recipes.drift) re-reads a recipe's source with `variants_at`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConfigError
from pipeline.gitw import GitRepo
from pipeline.toolpins import LM_EVAL_REQUIREMENT

UPSTREAM = "ROCm/ATOM"
SERVER_MODULE = "atom.entrypoints.openai_server"
BENCH_MODULE = "atom.benchmarks.benchmark_serving"
GSM8K_TEST_DOCS = 1319  # documents in GSM8K's test split (lm_eval's `limit: None`)
DEFAULT_PORT = 8000  # atom/entrypoints/openai/api_server.py: --server-port default
MI355_GFX = "gfx950"

_SOURCE_RE = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+) (?P<path>\S+\.md) @ (?P<sha>[0-9a-f]{7,40})\b")
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_GPUS_RE = re.compile(r"(\d+)\s*[x×]\s*MI355", re.I)
_VAR_RE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")
_ARITH_RE = re.compile(r"\$\(\(\s*\$?\{?(\w+)\}?\s*\*\s*(\d+)\s*\)\)")
_ARITH_TOKEN = re.compile(r"^@@arith:(\w+):(\d+)@@$")


class RecipeParseError(ConfigError):
    """Upstream markdown this importer cannot read; the message names the file and line."""


# -- markdown ----------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    line: int  # markdown line of the first line inside the fence (1-based)
    lang: str
    lines: tuple[str, ...]
    headings: tuple[str, ...]  # the heading path above it, outermost first


@dataclass(frozen=True)
class Table:
    line: int
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    headings: tuple[str, ...]
    caption: str  # the text lines just above it (in a ```text block: the block's first lines too)


def _cells(line: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in line.strip().strip("|").split("|"))


def _scan(text: str) -> tuple[list[Block], list[Table]]:
    blocks: list[Block] = []
    tables: list[Table] = []
    lines = text.split("\n")
    heads: list[tuple[int, str]] = []
    recent: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        h = _HEADING_RE.match(line)
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if h and not fence:
            level = len(h.group(1))
            heads = [x for x in heads if x[0] < level] + [(level, h.group(2))]
            recent = []
            i += 1
            continue
        path = tuple(t for _, t in heads)
        if fence:
            marker, lang = fence.group(1), fence.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(marker):
                j += 1
            body = tuple(lines[i + 1 : j])
            blocks.append(Block(i + 2, lang, body, path))
            # Tables inside a text block (upstream puts lm_eval's output in ```text fences).
            inner = [k for k, b in enumerate(body) if b.strip().startswith("|")]
            if inner:
                k = inner[0]
                while k < len(body):
                    if body[k].strip().startswith("|"):
                        start = k
                        while k < len(body) and body[k].strip().startswith("|"):
                            k += 1
                        caption = " ".join([*recent[-3:], *[b for b in body[:start] if b.strip()][-2:]])
                        tables.append(_table(body[start:k], i + 2 + start, path, caption))
                    k += 1
            recent = []
            i = j + 1
            continue
        if line.strip().startswith("|"):
            start = i
            while i < len(lines) and lines[i].strip().startswith("|"):
                i += 1
            tables.append(_table(tuple(lines[start:i]), start + 1, path, " ".join(recent[-3:])))
            recent = []
            continue
        if line.strip():
            recent.append(line.strip())
        i += 1
    return blocks, tables


def _table(rows: Sequence[str], line: int, headings: tuple[str, ...], caption: str) -> Table:
    cells = [_cells(r) for r in rows]
    body = tuple(c for c in cells[1:] if not all(re.fullmatch(r":?-+:?", x) or not x for x in c))
    return Table(line, cells[0] if cells else (), body, headings, caption)


# -- shell -------------------------------------------------------------------------


@dataclass
class Command:
    argv: list[str]
    line: int
    env: dict[str, str]  # `VAR=value cmd` prefixes
    piped: bool = False  # `2>&1 | tee log` removed
    background: bool = False  # trailing `&` removed


@dataclass
class Script:
    """A shell block read the way bash would, for the lines recipes use."""

    vars: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)  # `${x:-default}` seen for x
    env: dict[str, str] = field(default_factory=dict)
    commands: list[Command] = field(default_factory=list)


def _logical(block: Block) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for k, raw in enumerate(block.lines):
        line = raw.rstrip()
        if not buf:
            start = block.line + k
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append((start, buf.strip()))
        buf = ""
    if buf:
        out.append((start, buf.strip()))
    return out


def read_script(block: Block, where: str) -> Script:
    s = Script()
    for line_no, line in _logical(block):
        line = _ARITH_RE.sub(lambda m: f"@@arith:{m.group(1)}:{m.group(2)}@@", line)  # one shell word
        try:
            words = shlex.split(line, comments=True, posix=True)
        except ValueError as e:
            raise RecipeParseError(
                f"{where}:{line_no}: cannot split the shell line ({e}): {line[:80]}"
            ) from None
        if not words:
            continue
        background = False
        if words[-1] == "&":
            background, words = True, words[:-1]
        elif words[-1].endswith("&") and not words[-1].endswith("&&"):
            background, words[-1] = True, words[-1][:-1]
        piped = False
        if "|" in words:
            cut = words.index("|")
            if words[cut + 1 : cut + 2] != ["tee"]:
                raise RecipeParseError(
                    f"{where}:{line_no}: a pipe into {words[cut + 1 : cut + 2]} is not a log tee"
                )
            words, piped = words[:cut], True
        if words and words[-1] == "2>&1":
            words = words[:-1]
        if words[0] == "export":
            for w in words[1:]:
                k, eq, v = w.partition("=")
                if eq:
                    s.env[k] = _expand(v, s, where, line_no)
            continue
        prefix: dict[str, str] = {}
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            k, _, v = words.pop(0).partition("=")
            prefix[k] = v
        if not words:  # plain assignments
            for k, v in prefix.items():
                m = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", v)
                if m and m.group(1) == k:
                    s.defaults[k] = m.group(2)
                    s.vars[k] = m.group(2)
                else:
                    s.vars[k] = _expand(v, s, where, line_no)
            continue
        env = {k: _expand(v, s, where, line_no) for k, v in prefix.items()}
        s.commands.append(Command(words, line_no, env, piped, background))
    return s


def _expand(value: str, s: Script, where: str, line_no: int, keep: Iterable[str] = ()) -> str:
    """Substitute known variables; `keep` names stay as `${name}` placeholders."""
    kept = set(keep)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in kept:
            return "${" + name + "}"
        if m.group(2) is not None and name not in s.vars:
            return m.group(2)
        if name in s.vars:
            return s.vars[name]
        raise RecipeParseError(f"{where}:{line_no}: ${name} is not set in the block")

    return _VAR_RE.sub(sub, value)


# -- variants ----------------------------------------------------------------------


@dataclass
class GsmRef:
    value: float
    stderr: float
    line: int
    caption: str
    samples_inferred: bool


@dataclass
class BenchRef:
    isl: int
    osl: int
    rows: list[dict[str, float | int]]
    line: int
    caption: str


@dataclass
class Variant:
    """One MI355 server configuration of an upstream recipe, with what belongs to it."""

    name: str
    heading: str
    line: int  # markdown line of the server block
    model_id: str
    gpus: int
    environment: dict[str, str]
    server: list[str]
    port: int
    inferred: dict[str, str] = field(default_factory=dict)  # field -> why it is inferred
    architecture: str | None = None
    gsm8k: list[str] | None = None
    gsm8k_line: int = 0
    gsm8k_ref: GsmRef | None = None
    bench: list[str] | None = None
    bench_line: int = 0
    bench_per_conc: int = 10
    bench_ref: BenchRef | None = None

    def facts(self) -> dict[str, Any]:
        """What drift compares: flags, environment and reference numbers."""
        return {
            "model": self.model_id,
            "gpus": self.gpus,
            "environment": dict(sorted(self.environment.items())),
            "server": list(self.server),
            "gsm8k command": list(self.gsm8k or []),
            "gsm8k reference": [self.gsm8k_ref.value, self.gsm8k_ref.stderr] if self.gsm8k_ref else None,
            "benchmark command": list(self.bench or []),
            "benchmark reference": self.bench_ref.rows if self.bench_ref else None,
        }


def _flag(argv: Sequence[str], *names: str) -> tuple[int, str] | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return i, argv[i + 1]
            if a.startswith(n + "="):
                return i, a.split("=", 1)[1]
    return None


def _server(cmd: Command, script: Script, where: str) -> tuple[list[str], str, int, dict[str, str]]:
    """(argv with ${model}/${port}, model id, port, inferred notes)."""
    argv = list(cmd.argv)
    inferred: dict[str, str] = {}
    if argv[:1] == ["python3"]:
        argv[0] = "python"
    m = _flag(argv, "--model")
    if m is None:
        raise RecipeParseError(f"{where}:{cmd.line}: the server command has no --model")
    i, raw = m
    model_vars = [g[0] or g[2] for g in _VAR_RE.findall(raw)]
    model = _expand(raw, script, where, cmd.line)
    if "<" in model or not model:
        raise RecipeParseError(f"{where}:{cmd.line}: --model {raw!r} is a placeholder, not a model id")
    out: list[str] = []
    port = DEFAULT_PORT
    skip = False
    for k, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if k == i:
            if a == "--model":
                out += ["--model", "${model}"]
                skip = True
            else:
                out.append("--model=${model}")
            continue
        if a in ("--server-port",) and k + 1 < len(argv):
            port = int(_expand(argv[k + 1], script, where, cmd.line))
            out += [a, "${port}"]
            skip = True
            continue
        value = _expand(a, script, where, cmd.line)
        if re.search(r"<[\w-]+>", value):
            raise RecipeParseError(f"{where}:{cmd.line}: {a!r} is a placeholder to fill in, not a value")
        if "$(" in value or "`" in value:
            raise RecipeParseError(f"{where}:{cmd.line}: command substitution in {a!r}")
        out.append(value)
    if "--server-port" not in argv and not any(a.startswith("--server-port=") for a in argv):
        out += ["--server-port", "${port}"]
        inferred["server.port"] = f"the command sets no --server-port: ATOM's default {DEFAULT_PORT}"
    if model_vars and model_vars[0] in script.defaults:
        inferred["model.id"] = f"${model_vars[0]}'s default in the block"
    return out, model, port, inferred


def _tp(argv: Sequence[str]) -> int | None:
    got = _flag(argv, "--tensor-parallel-size", "-tp")
    return int(got[1]) if got and got[1].isdigit() else None


def _gsm_ref(table: Table, where: str) -> GsmRef | None:
    header = [h.lower() for h in table.header]
    if "tasks" not in header or "value" not in header:
        return None
    try:
        f, v = header.index("filter"), header.index("value")
        se = header.index("stderr")
    except ValueError:
        raise RecipeParseError(
            f"{where}:{table.line}: a GSM8K table without Filter/Value/Stderr columns"
        ) from None
    for row in table.rows:
        if len(row) > max(f, v, se) and row[f] == "flexible-extract":
            try:
                value, stderr = float(row[v]), float(row[se])
            except ValueError:
                raise RecipeParseError(
                    f"{where}:{table.line}: flexible-extract row has no numbers: {row}"
                ) from None
            return GsmRef(value, stderr, table.line, table.caption, "limit: None" not in table.caption)
    raise RecipeParseError(f"{where}:{table.line}: a GSM8K table without a flexible-extract row")


_BENCH_COLUMNS = {
    "conc": "concurrency",
    "concurrency": "concurrency",
    "requests": "requests",
    "duration (s)": "duration_s",
    "mean ttft (ms)": "mean_ttft_ms",
    "p99 ttft (ms)": "p99_ttft_ms",
    "mean tpot (ms)": "mean_tpot_ms",
    "p99 tpot (ms)": "p99_tpot_ms",
    "output tok/s": "output_throughput",
    "total tok/s": "total_token_throughput",
    "isl": "isl",
    "osl": "osl",
}


def _bench_ref(table: Table, isl: int, osl: int, where: str) -> BenchRef:
    keys = [_BENCH_COLUMNS.get(h.lower()) for h in table.header]
    needed = {"concurrency", "mean_ttft_ms", "mean_tpot_ms", "output_throughput"}
    if not needed <= set(k for k in keys if k):
        raise RecipeParseError(
            f"{where}:{table.line}: the reference table lacks {sorted(needed - set(k for k in keys if k))} "
            f"(columns: {', '.join(table.header)})"
        )
    rows: list[dict[str, float | int]] = []
    for row in table.rows:
        if len(row) != len(keys):
            raise RecipeParseError(f"{where}:{table.line}: row {row} does not fit the header")
        got: dict[str, float | int] = {"isl": isl, "osl": osl}
        for k, cell in zip(keys, row, strict=True):
            if k is None:
                continue
            try:
                num = float(cell.replace(",", ""))
            except ValueError:
                raise RecipeParseError(
                    f"{where}:{table.line}: {cell!r} in column {k} is not a number"
                ) from None
            got[k] = int(num) if k in ("concurrency", "requests", "isl", "osl") else num
        rows.append(got)
    return BenchRef(isl, osl, rows, table.line, table.caption)


def _token(model_id: str, heading: str) -> str:
    """The word that names a variant in captions: MXFP4, FP8, BF16 ... (from heading or model)."""
    for source in (heading, model_id):
        m = re.search(r"\b(MXFP4|MXFP8|FP4|FP8|BF16|INT4|W4A8)\b", source, re.I)
        if m:
            return m.group(1).upper()
    return ""


def parse_markdown(text: str, where: str) -> tuple[list[Variant], list[str], list[RecipeParseError]]:
    """The MI355 variants of one upstream recipe, notes on what was skipped, and per-variant errors."""
    blocks, tables = _scan(text)
    variants: list[Variant] = []
    notes: list[str] = []
    errors: list[RecipeParseError] = []
    names: dict[str, int] = {}
    lm_blocks = [b for b in blocks if any(ln.lstrip().startswith("lm_eval") for ln in b.lines)]
    bench_blocks = [b for b in blocks if any(BENCH_MODULE in ln for ln in b.lines)]
    for b in blocks:
        if not any(SERVER_MODULE in ln for ln in b.lines):
            continue
        heading = b.headings[-1] if b.headings else ""
        if not any("MI355" in h for h in b.headings):
            notes.append(f"{where}:{b.line}: server block under {heading!r} names no MI355: skipped")
            continue
        if any("docker run" in ln or "atomesh" in ln for ln in b.lines):
            notes.append(
                f"{where}:{b.line}: server block under {heading!r} is not a plain server launch: skipped"
            )
            continue
        try:
            v = _variant(b, where, tables, lm_blocks, bench_blocks, names, notes)
        except RecipeParseError as e:
            errors.append(e)
            continue
        if v is not None:
            variants.append(v)
    return variants, notes, errors


def _variant(
    b: Block,
    where: str,
    tables: list[Table],
    lm_blocks: list[Block],
    bench_blocks: list[Block],
    names: dict[str, int],
    notes: list[str],
) -> Variant | None:
    heading = b.headings[-1] if b.headings else ""
    script = read_script(b, where)
    servers = [c for c in script.commands if SERVER_MODULE in c.argv]
    if len(servers) != 1:
        notes.append(f"{where}:{b.line}: {len(servers)} server commands in one block: skipped")
        return None
    cmd = servers[0]
    argv, model_id, port, inferred = _server(cmd, script, where)
    env = {**script.env, **cmd.env}
    heading_path = " / ".join(b.headings)
    g = _GPUS_RE.search(heading_path)
    tp = _tp(argv)
    if g:
        gpus = int(g.group(1))
    elif tp:
        gpus = tp
        inferred["hardware.gpus"] = f"the heading names no GPU count: the command's tensor parallel size {tp}"
    else:
        raise RecipeParseError(f"{where}:{b.line}: neither the heading nor the command says how many GPUs")
    name = model_id.rsplit("/", 1)[-1]
    method = _flag(argv, "--method")
    if method and method[1].lower() not in name.lower():
        name = f"{name}-{method[1].upper()}"  # a speculative-decoding variant of the same model
    if name in names:
        extra = "-".join(w for w in re.findall(r"\b[A-Z][A-Z0-9]{1,}\b", heading) if w not in name)
        if not extra:
            notes.append(f"{where}:{b.line}: a second server block for {name} under {heading!r}: skipped")
            return None
        name = f"{name}-{extra}"
    names[name] = b.line
    v = Variant(name, heading_path, b.line, model_id, gpus, env, argv, port, inferred)
    token = _token(model_id, heading)
    _attach_gsm8k(v, token, tables, lm_blocks, where)
    _attach_bench(v, token, tables, bench_blocks, where)
    return v


def _pick(tables: list[Table], token: str) -> Table | None:
    """The table whose caption names this variant; else the file's only table of that kind."""
    if token:
        named = [t for t in tables if re.search(rf"\b{re.escape(token)}\b", t.caption, re.I)]
        plain = [t for t in named if not re.search(r"EAGLE|MTP|speculative", t.caption, re.I)]
        if plain:
            return plain[0]
    # The file's only table, if its caption names no variant (one that names another is not ours).
    return tables[0] if len(tables) == 1 and not _token("", tables[0].caption) else None


def _attach_gsm8k(v: Variant, token: str, tables: list[Table], lm_blocks: list[Block], where: str) -> None:
    gsm = [t for t in tables if [h.lower() for h in t.header][:1] == ["tasks"]]
    table = _pick(gsm, token)
    if table is None or not lm_blocks:
        v.inferred["checks.gsm8k"] = "upstream gives no validated GSM8K result (and command) for this variant"
        return
    ref = _gsm_ref(table, where)
    if ref is None:
        return
    block = max((b for b in lm_blocks if b.line < table.line), key=lambda b: b.line, default=lm_blocks[0])
    script = read_script(block, where)
    cmds = [c for c in script.commands if c.argv[:1] == ["lm_eval"]]
    if len(cmds) != 1:
        raise RecipeParseError(f"{where}:{block.line}: expected one lm_eval command, found {len(cmds)}")
    argv: list[str] = []
    for a in cmds[0].argv:
        a = _model_ref(a, v.model_id, script)
        a = re.sub(r"(https?://[\w.]+):(\d+)/", r"\1:${port}/", a)
        if "${model}" in a or "${port}" in a:
            keep = ("model", "port")
            a = _expand(a, script, where, cmds[0].line, keep=keep)
        else:
            a = _expand(a, script, where, cmds[0].line)
        argv.append(a)
    if not any("${model}" in a for a in argv):
        raise RecipeParseError(f"{where}:{cmds[0].line}: the lm_eval command does not name the served model")
    if any(re.search(r"<[\w-]+>", a) for a in argv):
        raise RecipeParseError(f"{where}:{cmds[0].line}: the lm_eval command has a placeholder to fill in")
    v.gsm8k, v.gsm8k_line, v.gsm8k_ref = argv, cmds[0].line, ref


def _model_ref(arg: str, model_id: str, script: Script) -> str:
    """The served model as `${model}`: a `$model_path`-style variable, or the model id written out."""
    for name in sorted(script.vars, key=len, reverse=True):
        if script.vars[name] == model_id or name.lower() in ("model_path", "model"):
            arg = re.sub(rf"\$\{{{name}\}}|\${name}\b", "${model}", arg)
    arg = re.sub(r"\$\{?model_path\}?", "${model}", arg)
    return re.sub(rf"(?<![\w/.-]){re.escape(model_id)}(?![\w/.-])", "${model}", arg)


def _attach_bench(v: Variant, token: str, tables: list[Table], bench_blocks: list[Block], where: str) -> None:
    refs = [t for t in tables if any(h.lower() in ("conc", "concurrency") for h in t.header)]
    table = _pick(refs, token)
    if table is None or not bench_blocks:
        v.inferred["checks.serving-benchmark"] = (
            "upstream gives no reference table (and command) for this variant"
        )
        return
    block = max(
        (b for b in bench_blocks if b.line < table.line), key=lambda b: b.line, default=bench_blocks[0]
    )
    script = read_script(block, where)
    cmds = [c for c in script.commands if BENCH_MODULE in c.argv]
    if len(cmds) != 1:
        raise RecipeParseError(
            f"{where}:{block.line}: expected one benchmark_serving command, found {len(cmds)}"
        )
    for need in ("ISL", "OSL"):
        if need not in script.vars:
            raise RecipeParseError(f"{where}:{block.line}: the benchmark block does not set {need}")
    isl, osl = int(script.vars["ISL"]), int(script.vars["OSL"])
    keep = ("model", "port", "isl", "osl", "concurrency", "num_prompts")
    argv: list[str] = []
    for a in cmds[0].argv:
        key, eq, val = a.partition("=")
        m = _ARITH_TOKEN.match(val) if eq else None
        if m and m.group(1) == "CONC":
            v.bench_per_conc = int(m.group(2))
            argv.append(f"{key}=${{num_prompts}}")
            continue
        if key in ("--result-dir", "--result-filename"):
            continue  # the smoke runner sets them
        a = _model_ref(a, v.model_id, script)
        a = re.sub(r"(https?://[\w.]+):(\d+)\b", r"\1:${port}", a)
        a = re.sub(r"\$\{?ISL\}?", "${isl}", a)
        a = re.sub(r"\$\{?OSL\}?", "${osl}", a)
        a = re.sub(r"\$\{?CONC\}?", "${concurrency}", a)
        if "$(" in a:
            raise RecipeParseError(f"{where}:{cmds[0].line}: {a!r}: only $(( CONC * N )) is understood")
        argv.append(_expand(a, script, where, cmds[0].line, keep=keep))
    ref = _bench_ref(table, isl, osl, where)
    v.bench, v.bench_line, v.bench_ref = argv, cmds[0].line, ref


# -- YAML ----------------------------------------------------------------------------


def _q(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _argv(items: Sequence[str], indent: str) -> list[str]:
    return [f"{indent}- {_q(a)}" for a in items]


def render_yaml(v: Variant, source_path: str, sha: str) -> str:
    """Our recipe for one variant (validated by the caller through `parse_recipe`)."""
    inf = v.inferred
    out = [
        f"# {v.name} on {v.gpus}x MI355 ({MI355_GFX}), for `pipeline smoke`.",
        f"# Imported by `pipeline recipe import` from {UPSTREAM} {source_path} @ {sha[:10]}",
        f"# ({v.heading!r}, markdown line {v.line}). Comments say which fields were inferred.",
        "schema: atom-image-pipeline/recipe/v1",
        f"name: {v.name}",
        f"description: {_q(f'{v.name} served by ATOM OpenAI-compatible server, TP{v.gpus} on MI355')}",
        f"source: {_q(f'{UPSTREAM} {source_path} @ {sha}')}",
        "",
        "model:",
    ]
    if "model.id" in inf:
        out.append(f"  # inferred: {inf['model.id']}")
    out.append(f"  id: {v.model_id}")
    if v.architecture:
        out.append(f"  # inferred: {inf['model.architecture']}")
        out.append(f"  architecture: {v.architecture}")
    else:
        out.append(
            f"  # not inferred: {inf.get('model.architecture', '')}; set config.json's architectures[0]"
        )
    out += ["", "hardware:"]
    if "hardware.gpus" in inf:
        out.append(f"  # inferred: {inf['hardware.gpus']}")
    out += [
        f"  gpus: {v.gpus}",
        f"  gfx: {MI355_GFX}",
        "  name: MI355",
        "  devices: [/dev/kfd, /dev/dri]",
        "",
        "# inferred: the docker run options ATOM's images need on MI355 (the recipe runs in rocm/atom-dev).",
        "container:",
        "  devices: [/dev/kfd, /dev/dri]",
        "  group_add: [video]",
        "  ipc_mode: host",
        "  cap_add: [SYS_PTRACE]",
        "  security_opt: [seccomp=unconfined]",
        "  network_mode: host",
        "  hf_cache_mount: /root/.cache/huggingface",
        "",
    ]
    if v.environment:
        out.append("environment:")
        out += [f"  {k}: {_q(val)}" for k, val in v.environment.items()]
    else:
        out.append("environment: {}")
    out += [
        "",
        "secrets: [HF_TOKEN]",
        "",
        "server:",
        "  # The recipe's command ($model_path -> ${model}; its `2>&1 | tee` and `&` dropped).",
    ]
    out.append("  command:")
    out += _argv(v.server, "    ")
    if "server.port" in inf:
        out.append(f"  # inferred: {inf['server.port']}")
    out += [
        f"  port: {v.port}",
        "  health_path: /health",
        "  # inferred: the recipe names no time limit; ATOM CI waits 45 minutes for /health.",
        "  ready_timeout_s: 2700",
        "  poll_interval_s: 2",
        "  fatal_traceback: always",
        "",
        "checks:",
        "  # inferred: not in the recipe, our sanity request before the long checks.",
        "  - kind: chat",
        "    name: chat",
        '    prompt: "What is the capital of France? Answer with one word."',
        "    max_tokens: 2048",
        "    temperature: 0.0",
        "    finish_reasons: [stop, length, eos, stop_sequence, 'stop_\\d+', max_tokens]",
        '    expect_regex: "(?i)paris"',
        "    timeout_s: 600",
    ]
    if v.gsm8k and v.gsm8k_ref:
        r = v.gsm8k_ref
        out += [
            "",
            "  - kind: gsm8k",
            "    name: gsm8k",
            f"    # The recipe's lm_eval command (markdown line {v.gsm8k_line}).",
            "    command:",
            *_argv(v.gsm8k, "      "),
            "    # inferred: ATOM CI installs lm-eval when the image lacks it (pinned: the image's version).",
            '    setup: [sh, -c, "command -v lm_eval >/dev/null 2>&1 || '
            f"pip install '{LM_EVAL_REQUIREMENT}'\"]",
            "    task: gsm8k",
            "    metric: exact_match,flexible-extract",
            "    reference:",
            f"      # {_q(r.caption[:100])[1:-1]} (markdown line {r.line}): flexible-extract",
            f"      value: {r.value}",
            f"      stderr: {r.stderr}",
        ]
        if r.samples_inferred:
            out.append(
                f"      # inferred: the table names no limit; {GSM8K_TEST_DOCS} is the full test split"
            )
        else:
            out.append(
                f"      # limit: None in the validated run = the full test split, {GSM8K_TEST_DOCS} documents"
            )
        out += [
            f"      samples: {GSM8K_TEST_DOCS}",
            f"      source: {_q(f'{UPSTREAM} {source_path} @ {sha[:10]}')}",
            "    limit: null",
            "    quick_limit: 250",
            "    z: 3.0",
            "    # inferred: the recipe names no time limit.",
            "    timeout_s: 7200",
        ]
    else:
        out += ["", f"  # not imported: {inf.get('checks.gsm8k', 'no GSM8K result')}"]
    if v.bench and v.bench_ref:
        b = v.bench_ref
        concs = [int(r["concurrency"]) for r in b.rows]
        default = 16 if 16 in concs else concs[0]
        out += [
            "",
            "  - kind: serving-benchmark",
            "    name: serving-benchmark",
            f"    # The recipe's benchmark command (markdown line {v.bench_line}).",
            "    command:",
            *_argv(v.bench, "      "),
            f"    num_prompts_per_concurrency: {v.bench_per_conc}",
            "    # inferred: the recipe gives single runs, no spread.",
            "    tolerance: 0.10",
            f"    isl: {b.isl}",
            f"    osl: {b.osl}",
            f"    concurrencies: [{default}]",
            f"    quick_concurrencies: [{default}]",
            "    # inferred: the recipe names no time limit.",
            "    timeout_s: 1800",
            f"    # {_q(b.caption[:100])[1:-1]} (markdown line {b.line})",
            "    reference:",
        ]
        for row in b.rows:
            out.append("      - {" + ", ".join(f"{k}: {val}" for k, val in row.items()) + "}")
    else:
        out += ["", f"  # not imported: {inf.get('checks.serving-benchmark', 'no reference table')}"]
    return "\n".join(out) + "\n"


# -- reading upstream at a commit ----------------------------------------------------


def source_of(recipe_source: str) -> tuple[str, str] | None:
    """(markdown path, commit) from a recipe's `source:` line, or None when it is not upstream's."""
    m = _SOURCE_RE.match(recipe_source)
    if m is None or m.group("repo") != UPSTREAM:
        return None
    return m.group("path"), m.group("sha")


def variants_at(
    atom: GitRepo, rev: str, path: str
) -> tuple[list[Variant], list[str], list[RecipeParseError]] | None:
    """The variants of `path` at `rev`, or None when the file does not exist there."""
    data = atom.read_blob(rev, path)
    if data is None:
        return None
    return parse_markdown(data.decode("utf-8", "replace"), f"{path}@{rev[:10]}")


def import_recipes(
    atom: GitRepo, rev: str, path: str, *, only: Sequence[str] = ()
) -> tuple[list[tuple[Variant, str]], list[str]]:
    """[(variant, YAML)] for the MI355 variants of `path` at `rev` (each validated), and notes."""
    from pipeline.recipes.recipe import parse_recipe

    sha = atom.rev_parse(rev)
    if sha is None:
        raise ConfigError(f"ATOM ref {rev!r} is not a commit in {atom.path}.")
    got = variants_at(atom, sha, path)
    if got is None:
        raise ConfigError(f"{path} does not exist in ATOM {sha[:10]}.", hint="Name a file under recipes/.")
    variants, notes, errors = got
    if errors and not only:
        parsed = ", ".join(v.name for v in variants) or "none"
        raise RecipeParseError(
            f"{path} @ {sha[:10]}: " + " ".join(e.message for e in errors),
            hint=f"Nothing was written. Variants that parse: {parsed} (import them with --variant NAME).",
        )
    registry = _registry_at(atom, sha)
    for v in variants:
        _infer_architecture(v, registry, atom.read_blob(sha, path) or b"")
    if only:
        unknown = sorted(set(only) - {v.name for v in variants})
        if unknown:
            raise ConfigError(
                f"{path} @ {sha[:10]} has no MI355 variant {', '.join(unknown)}; "
                f"it has: {', '.join(v.name for v in variants) or 'none'}."
            )
        variants = [v for v in variants if v.name in only]
    out = []
    for v in variants:
        text = render_yaml(v, path, sha)
        parse_recipe(text, f"{v.name} (imported from {path}:{v.line})")
        out.append((v, text))
    return out, notes


def _registry_at(atom: GitRepo, sha: str) -> dict[str, tuple[str, int]]:
    from pipeline.compat.reach import REGISTRY_PATH, model_registry

    data = atom.read_blob(sha, REGISTRY_PATH)
    return (model_registry(data.decode("utf-8", "replace")) if data else None) or {}


def _infer_architecture(v: Variant, registry: dict[str, tuple[str, int]], markdown: bytes) -> None:
    """The registry key the recipe names, else the one whose module is named like the model."""
    text = markdown.decode("utf-8", "replace")
    named = sorted(k for k in registry if re.search(rf"\b{k}\b", text))
    if len(named) == 1:
        v.architecture = named[0]
        v.inferred["model.architecture"] = "the one class of ATOM's model registry the recipe names"
        return
    flat = re.sub(r"[^a-z0-9]", "", v.model_id.rsplit("/", 1)[-1].lower())
    by_module: dict[str, list[str]] = {}
    real: dict[str, str] = {}
    for k, (qual, _) in registry.items():
        mod = qual.replace(":", ".").rsplit(".", 1)[0]
        flat_mod = re.sub(r"[^a-z0-9]", "", mod.rsplit(".", 1)[-1].lower())
        by_module.setdefault(flat_mod, []).append(k)
        real[flat_mod] = mod.replace(".", "/") + ".py"
    hits = [m for m in by_module if m and flat.startswith(m)]
    # Only an unambiguous family: qwen3 also prefixes qwen3moe and qwen3next, so it says nothing.
    if len(hits) == 1 and not any(m != hits[0] and m.startswith(hits[0]) for m in by_module):
        keys = sorted(by_module[hits[0]], key=lambda k: (not k.endswith("ForCausalLM"), k))
        v.architecture = keys[0]
        v.inferred["model.architecture"] = (
            f"ATOM's registry module {real[hits[0]]} matches the model name; "
            f"of {', '.join(sorted(by_module[hits[0]]))} the causal LM"
        )
        return
    v.inferred["model.architecture"] = "the recipe names no class of ATOM's model registry"
