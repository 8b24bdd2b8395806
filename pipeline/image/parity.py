"""Parity of our image with upstream ATOM's release image (docker/Dockerfile, target atom_image).

`compare(upstream_text, deliberate)` reads upstream's Dockerfile at the pinned ATOM commit, keeps
the stages the `atom_image` target needs (FROM and COPY --from), and matches each of their steps
(RUN, COPY, ENV) against the reviewed list of deliberate differences (`dockerfiles/parity.toml`):
each entry names a stage, a regular expression over the step's text, what we do (`same`,
`different`, `omitted`) and why. A step no entry matches is reported as "upstream gained a step
we do not cover": this is how a rebuild at a new pin learns that upstream's image changed.
An entry that matches nothing is reported as stale. Pure: no git, no I/O besides reading the list.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pipeline.errors import RenderError
from pipeline.fsutil import read_text

UPSTREAM_DOCKERFILE = "docker/Dockerfile"
UPSTREAM_TARGET = "atom_image"
Parity = Literal["same", "different", "omitted"]
STATUSES: tuple[Parity, ...] = get_args(Parity)
KINDS = ("RUN", "COPY", "ENV")


@dataclass(frozen=True)
class Deliberate:
    stage: str
    match: str
    status: Parity
    ours: str
    reason: str

    def matches(self, step: Step) -> bool:
        return step.stage == self.stage and re.search(self.match, step.text) is not None


@dataclass(frozen=True)
class Step:
    stage: str
    kind: str
    text: str  # the instruction, continuation lines joined, whitespace squeezed

    @property
    def title(self) -> str:
        return self.text if len(self.text) <= 110 else self.text[:109] + "…"


@dataclass(frozen=True)
class Row:
    step: Step
    entry: Deliberate | None


@dataclass(frozen=True)
class ParityReport:
    rows: list[Row]
    stale: list[Deliberate]
    summary: str
    markdown: str
    uncovered: list[str] = field(default_factory=list)


def load_deliberate(path: Path) -> list[Deliberate]:
    """The reviewed list; a clear RenderError when it is missing or malformed."""
    if not path.exists():
        raise RenderError(
            f"the parity list {path} does not exist.",
            hint="Set [paths] parity_file to dockerfiles/parity.toml (the reviewed list of differences).",
        )
    text = read_text(path, what="parity list", error=RenderError)  # bounded, a regular file only
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RenderError(f"the parity list {path} cannot be read: {e}.") from None
    out = []
    for i, raw in enumerate(data.get("step", [])):
        try:
            status = str(raw["status"])
            if status not in STATUSES:
                raise RenderError(f"{path}: step {i + 1} has status {status!r}; use one of {STATUSES}.")
            entry = Deliberate(
                stage=str(raw["stage"]),
                match=str(raw["match"]),
                status=status,
                ours=str(raw.get("ours", "")),
                reason=str(raw["reason"]),
            )
            re.compile(entry.match)
        except (KeyError, TypeError, re.error) as e:
            raise RenderError(f"{path}: step {i + 1} is malformed ({e}).") from None
        out.append(entry)
    return out


def _instructions(text: str) -> list[tuple[str, str]]:
    """(keyword, joined text) of each instruction; comments and blank lines dropped."""
    out: list[tuple[str, str]] = []
    buf: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        joined = " ".join(p for p in buf if p)
        buf = []
        keyword = joined.split(None, 1)[0].upper()
        out.append((keyword, re.sub(r"\s+", " ", joined)))
    return out


def target_steps(text: str, target: str = UPSTREAM_TARGET) -> list[Step]:
    """The steps of `target` and of every stage it needs, in file order."""
    stages: dict[str, list[tuple[str, str]]] = {}
    parents: dict[str, set[str]] = {}
    order: list[str] = []
    current = ""
    for keyword, joined in _instructions(text):
        if keyword == "FROM":
            m = re.match(r"FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", joined, re.I)
            image = m.group(1) if m else ""
            current = (m.group(2) if m and m.group(2) else f"stage{len(order)}").lower()
            order.append(current)
            stages[current] = []
            parents[current] = {image.lower()}
            continue
        if not current:
            continue
        stages[current].append((keyword, joined))
        if keyword == "COPY":
            m = re.search(r"--from=(\S+)", joined)
            if m:
                parents[current].add(m.group(1).lower())
    if target not in stages:
        return []
    need: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in need or name not in stages:
            continue
        need.add(name)
        todo.extend(parents[name])
    return [
        Step(stage, keyword, joined)
        for stage in order
        if stage in need
        for keyword, joined in stages[stage]
        if keyword in KINDS
    ]


def compare(
    upstream_text: str | None,
    deliberate: list[Deliberate],
    *,
    atom_commit: str,
    target: str = UPSTREAM_TARGET,
) -> ParityReport:
    """Each upstream step with the entry that covers it; the summary line; the Markdown report."""
    short = atom_commit[:10]
    if upstream_text is None:
        summary = f"parity: ATOM {short} has no {UPSTREAM_DOCKERFILE}; nothing to compare"
        return ParityReport([], [], summary, f"# Parity with upstream's image\n\n{summary}.\n")
    steps = target_steps(upstream_text, target)
    if not steps:
        summary = f"parity: {UPSTREAM_DOCKERFILE} at ATOM {short} has no target {target}; nothing to compare"
        return ParityReport([], [], summary, f"# Parity with upstream's image\n\n{summary}.\n")
    rows = [Row(step, next((d for d in deliberate if d.matches(step)), None)) for step in steps]
    used = {id(r.entry) for r in rows if r.entry is not None}
    stale = [d for d in deliberate if id(d) not in used]
    uncovered = [f"[{r.step.stage}] {r.step.title}" for r in rows if r.entry is None]
    counts = {s: sum(1 for r in rows if r.entry is not None and r.entry.status == s) for s in STATUSES}
    summary = (
        f"parity with upstream {target} at ATOM {short}: {len(rows)} steps, {counts['same']} same, "
        f"{counts['different']} done differently, {counts['omitted']} deliberately left out"
    )
    if uncovered:
        summary += f"; upstream gained {len(uncovered)} step(s) we do not cover"
    lines = [
        "# Parity with upstream's image",
        "",
        f"Upstream: `{UPSTREAM_DOCKERFILE}` target `{target}` at ATOM `{atom_commit}`, with the stages it "
        "needs. Ours: this context's `Dockerfile`. The deliberate differences are the reviewed list "
        "`dockerfiles/parity.toml`.",
        "",
        f"**{summary}.**",
        "",
    ]
    if uncovered:
        lines += ["## Upstream gained a step we do not cover", ""]
        lines += [f"- {u}" for u in uncovered]
        lines += ["", "Review it, then do it in the template or add it to the parity list with a reason.", ""]
    lines += ["## Steps", "", "| stage | upstream step | ours | why |", "|---|---|---|---|"]
    for r in rows:
        ours = f"{r.entry.status}: {r.entry.ours}" if r.entry else "**not covered**"
        why = r.entry.reason if r.entry else "upstream gained a step we do not cover"
        lines.append(f"| {r.step.stage} | `{_cell(r.step.title)}` | {_cell(ours)} | {_cell(why)} |")
    if stale:
        lines += ["", "## Entries that match no upstream step (remove them?)", ""]
        lines += [f"- [{d.stage}] `{_cell(d.match)}`: {d.reason}" for d in stale]
    return ParityReport(rows, stale, summary, "\n".join(lines) + "\n", uncovered)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")
