"""Which aiter signature a call was written for, decided from the call itself.

The candidates are the distinct signatures the callee has had over aiter's
history. Each is scored by how well the call fits it: Python binding errors,
evident types clashing with annotations, and argument names that name a
parameter (`self.kv_cache` -> `kv_cache`) landing on it or on another one.
The best fit is the signature the call was written for; among equal fits the
one in effect when the call's lines were last changed (`git blame`) wins, then
the nearest before it. Neither the date of the ATOM commit nor blame alone
decides: a call whose arguments did not fit aiter when it was written, after
which aiter changed to fit it, was written for the later signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.compat.aiterapi import Signature
from pipeline.compat.bind import Binding, annotation_types, bind
from pipeline.compat.calls import Arg, RawCall

_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)$")


def arg_name(a: Arg) -> str | None:
    """The name an argument expression spells (`self.kv_cache` -> `kv_cache`), if it is a plain name."""
    m = _NAME.match(a.text)
    if m is None:
        return None
    name = m.group(1).lstrip("_")
    return name or None


@dataclass(frozen=True, slots=True)
class Agreement:
    """How a call's positional argument names agree with the parameters they land on."""

    agree: int  # named like the parameter it lands on
    disagree: tuple[int, ...]  # 1-based: named like another parameter of the signature


def agreement(call: RawCall, sig: Signature, b: Binding) -> Agreement:
    """Names first (`self.block_size` on `block_size`); else a literal's kind: `True` on a `bool`
    parameter agrees, on an `int` or `float` one (which accepts it silently) it disagrees."""
    names = {p.name.lstrip("_") for p in sig.params if p.kind in ("posonly", "pos", "kwonly")}
    agree = 0
    disagree: list[int] = []
    for i, (a, p) in enumerate(zip(call.args, b.positional, strict=True), 1):
        if p is None:
            continue
        n = arg_name(a)
        if n is not None and n == p.name.lstrip("_"):
            agree += 1
        elif n is not None and n in names:
            disagree.append(i)
        elif a.etype == "bool" and p.kind != "vararg":
            kinds = annotation_types(p.annotation)
            if kinds is not None and "bool" in kinds:
                agree += 1
            elif kinds is not None and kinds & {"int", "float"}:
                disagree.append(i)
    return Agreement(agree, tuple(disagree))


Score = tuple[int, int, int, int]


def fit_score(call: RawCall, sig: Signature) -> tuple[Binding, Score]:
    """(binding, score): lower is a better fit. Binding errors, then type clashes, then names."""
    b = bind(call, sig)
    hard = sum(1 for p in b.problems if p.kind != "type-mismatch")
    types = sum(1 for p in b.problems if p.kind == "type-mismatch")
    ag = agreement(call, sig, b)
    return b, (hard, types, len(ag.disagree), -ag.agree)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One distinct signature of the callee and when aiter had it (first-parent commit times)."""

    sha: str  # an aiter commit carrying it (the newest one seen)
    sig: Signature
    since: int  # commit time it appeared (0: unknown)
    until: int | None  # commit time it was replaced (None: still at the newest commit seen)
    source: str  # "pin", "explicit", "date", "blame", "history"


@dataclass(frozen=True, slots=True)
class Fit:
    cand: Candidate
    binding: Binding
    score: Score

    @property
    def clean(self) -> bool:
        return self.binding.ok


def _distance(c: Candidate, when: int | None) -> tuple[int, int]:
    """How far the candidate's period is from the time the call was written (in effect, before, after)."""
    if when is None:
        return (1, 0)
    if c.since <= when and (c.until is None or when < c.until):
        return (0, 0)
    if c.until is not None and c.until <= when:
        return (1, when - c.until)
    return (2, c.since - when)


def best_fit(call: RawCall, candidates: list[Candidate], written: int | None) -> Fit | None:
    """The candidate the call fits best; ties go to the one in effect when its lines were written."""
    best: tuple[tuple[Score, tuple[int, int]], Fit] | None = None
    for c in candidates:
        b, s = fit_score(call, c.sig)
        key = (s, _distance(c, written))
        if best is None or key < best[0]:
            best = (key, Fit(c, b, s))
    return best[1] if best is not None else None


def tied(call: RawCall, candidates: list[Candidate]) -> bool:
    """Do candidates of different layouts fit the call equally well (so that its blame date decides)?"""
    scored = [(fit_score(call, c.sig)[1], layout(c.sig)) for c in candidates]
    if not scored:
        return False
    best = min(s for s, _ in scored)
    return len({lay for s, lay in scored if s == best}) > 1


Layout = tuple[tuple[str, str, bool, bool, str | None], ...]
_LAYOUTS: dict[int, tuple[Signature, Layout]] = {}


def layout(sig: Signature) -> Layout:
    """What decides how a call binds (names, kinds, defaults, None-defaults, annotations)."""
    got = _LAYOUTS.get(id(sig))
    if got is not None and got[0] is sig:
        return got[1]
    if len(_LAYOUTS) > 100_000:
        _LAYOUTS.clear()
    lay = tuple((p.name, p.kind, p.has_default, p.default_none, p.annotation) for p in sig.params)
    _LAYOUTS[id(sig)] = (sig, lay)
    return lay


def problem_keys(b: Binding) -> frozenset[str]:
    return frozenset(p.key for p in b.problems)
