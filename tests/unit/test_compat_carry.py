"""The key a verdict is carried by (`pipeline.compat.carry.position_free`)."""

from __future__ import annotations

import dataclasses

from pipeline.compat.calls import Arg, RawCall, SigGuard
from pipeline.compat.carry import CLEAN, UNCHECKED, Night, Verdict, position_free


def _call(**kw: object) -> RawCall:
    base: dict[str, object] = dict(
        path="atom/m.py", line=10, col=4, display="aiter.f", ref=("aiter", ("f",)),
        args=(Arg("x", None),), kwargs=(), star_args=False, star_kwargs=False, guarded=False,
    )  # fmt: skip
    return RawCall(**{**base, **kw})  # type: ignore[arg-type]


def test_where_a_call_stands_is_not_in_its_key_and_everything_else_is() -> None:
    # A field added to RawCall must be placed: in the key, or named here as a position (the path
    # is the file a night keeps the key under: `Night.keep`).
    position = {"line", "col", "end_line", "import_line", "sig_guards", "path"}
    names = {f.name for f in dataclasses.fields(RawCall)}
    moved = _call(
        line=99, col=0, end_line=101, import_line=3, sig_guards=(SigGuard(98, "t", ("aiter", ()), None),)
    )
    assert position_free(moved) == position_free(_call())
    for name in sorted(names - position):
        value = getattr(_call(), name)
        other = (
            not value if isinstance(value, bool)
            else ("aiter", ("g",)) if name == "ref"
            else (Arg("y", "int"),) if name == "args"
            else (("k", Arg("y", None)),) if name == "kwargs"
            else value + "x"
        )  # fmt: skip
        assert position_free(_call(**{name: other})) != position_free(_call()), name
    assert len(position_free(_call())) == len(names - position)


def test_calls_alike_in_two_files_are_kept_apart() -> None:
    night = Night((None,), "p", None, "p")
    here, there = _call(), _call(path="atom/n.py")
    night.keep(here, Verdict(CLEAN, "", frozenset(), None, None))
    night.keep(there, Verdict(UNCHECKED, "why", frozenset(), None, None))
    got = night.get(there)
    assert got is not None and got.reason == "why" and night.get(here) != got
    assert night.get(_call(path="atom/o.py")) is None
