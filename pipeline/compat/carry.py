"""Last night's verdicts on tonight's calls: a check a few commits on binds only what changed.

A scheduled check runs an ATOM × aiter pair a few commits on from the last one.
Most calls are the same call in the same place, and most of what they resolved
through in aiter is the same blobs. A call whose verdict was plain is carried to
the next check together with everything that verdict read:

- *clean*: it binds at the pin and no screen doubts the layout it was written for;
- *not aiter's*: it resolves to a module or to a value of another library's type;
- *unchecked*: it resolves to nothing with a signature, for a recorded reason.

What such a verdict read is exactly: the resolution of the callee at the pin and at
the ATOM-date screen (`ApiIndex.deps_of`: the blobs, module existence and "does not
mention" facts each relied on), checked again against tonight's trees; the
first-parent history of the callee's file (its layout when the ATOM file was
created), carried only when no aiter commit since touched that file; and when
the ATOM file was created. A finding, a call a screen doubted, a `torch.ops` call
(found by every file that names the op) is checked in full every night. So a
carried verdict is the verdict a cold check gives: tests replay nights on fixture
histories against cold checks, and the benchmark compares on the real mirrors.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeline.compat.aiterapi import ApiIndex, Dep
from pipeline.compat.calls import RawCall

CLEAN, NOT_AITERS, UNCHECKED = "clean", "not-aiters", "unchecked"


class Verdict(NamedTuple):  # (a tuple: a night's hundreds of them pickle and unpickle in C)
    outcome: str  # CLEAN, NOT_AITERS or UNCHECKED
    reason: str  # why unchecked
    at_pin: frozenset[Dep]  # what the callee's resolution at the pin relied on
    at_date: frozenset[Dep] | None  # the same at the ATOM-date screen, when the screen read it
    history: tuple[str, int] | None  # (the callee's aiter file, the ATOM file's creation) when read
    unparseable: tuple[tuple[str, str], ...] = ()  # aiter files it read that do not parse
    # a `torch.ops.aiter` call: the files that name the op at the pin and at the date screen (an op
    # is found through them), and the ATOM file that registers it itself
    op: tuple[tuple[str, ...], tuple[str, ...] | None, str | None] | None = None


@dataclass
class Night:
    """What one check leaves for the next: its pair's moving commits and its verdicts.

    The verdicts are kept per ATOM file, each file's pickled on its own: the next night
    unpickles a file's when its calls are checked, and writes back as they were read the
    files whose verdicts it carried unchanged (most of them: a night re-pickled all ~800)."""

    context: tuple[object, ...]  # what every verdict shares (the explicit baseline)
    pin: str
    date: str | None  # the ATOM-date screen's aiter
    tip: str  # aiter's default branch, whose first-parent history was read
    # ATOM file -> `position_free` call -> verdict
    verdicts: dict[str, dict[tuple[object, ...], Verdict]] = field(default_factory=dict)
    packed: dict[str, bytes] = field(default_factory=dict)  # a file's verdicts as read, not yet unpickled
    before: Night | None = None  # the night this one carried from (whose files it may write back)
    _read: dict[str, bytes] = field(default_factory=dict)  # a file's verdicts' bytes, when unpickled

    def keep(self, call: RawCall, verdict: Verdict) -> None:
        self.verdicts.setdefault(call.path, {})[position_free(call)] = verdict

    def get(self, call: RawCall) -> Verdict | None:
        return self.file(call.path).get(position_free(call))

    def file(self, path: str) -> dict[tuple[object, ...], Verdict]:
        got = self.verdicts.get(path)
        if got is None:
            raw = self.packed.pop(path, None)
            got = self.verdicts[path] = pickle.loads(raw) if raw is not None else {}
            if raw is not None:
                self._read[path] = raw
        return got

    def all(self) -> Iterator[Verdict]:
        for path in [*self.verdicts, *self.packed]:
            yield from self.file(path).values()

    def __reduce__(self) -> tuple[object, ...]:
        packed = dict(self.packed)
        for path, got in self.verdicts.items():
            packed[path] = self._as_before(path, got) or pickle.dumps(got, pickle.HIGHEST_PROTOCOL)
        return _night, (self.context, self.pin, self.date, self.tip, packed)

    def _as_before(self, path: str, got: dict[tuple[object, ...], Verdict]) -> bytes | None:
        """The bytes the last night's verdicts of `path` were read from, when these are those."""
        was = self.before.verdicts.get(path) if self.before is not None else None
        raw = self.before._read.get(path) if self.before is not None else None
        if raw is None or was is None or was.keys() != got.keys():
            return None
        return raw if all(v is was[k] for k, v in got.items()) else None


def _night(
    context: tuple[object, ...], pin: str, date: str | None, tip: str, packed: dict[str, bytes]
) -> Night:
    return Night(context, pin, date, tip, packed=packed)


def position_free(call: RawCall) -> tuple[object, ...]:
    """The call without where it stands (line, column, import line, the guards' lines) or its file:
    a plain verdict does not depend on it (an edit above a call moves it, and its verdict moves
    with it). Its arguments as plain tuples: thousands of them are read back every night."""
    return (
        call.display, call.ref, tuple((a.text, a.etype) for a in call.args),
        tuple((k, a.text, a.etype) for k, a in call.kwargs), call.star_args, call.star_kwargs, call.guarded,
    )  # fmt: skip


class Carried:
    """Last night's verdicts, each given out only when everything it read still holds tonight."""

    def __init__(
        self,
        night: Night,
        pin: tuple[ApiIndex, frozenset[str]],
        date: tuple[ApiIndex | None, frozenset[str] | None],
        history: frozenset[str],
        born: Callable[[str], int | None],
        atom_op: Callable[[str], str | None],
    ) -> None:
        """`pin`: tonight's index at the pin, and the aiter files changed between last night's pin
        and tonight's; `date`: the same for the ATOM-date screen (no index: it is the pin tonight;
        no files: last night had none); `history`: the files changed between the oldest commit
        last night's histories were read from and tonight's tip; `born`: when an ATOM file was
        created; `atom_op`: the ATOM file that registers an op itself."""
        self.night = night
        self._indexes = (pin[0], date[0])
        self._same = (pin[1], date[1])  # files not in these are the same text at both commits
        self.history = history
        self._born = born
        self._atom_op = atom_op
        self._valid: list[dict[frozenset[Dep], bool]] = [{}, {}]  # per index: deps -> still holds

    def verdict(self, call: RawCall) -> Verdict | None:
        v = self.night.get(call)
        if v is None:
            return None
        if not self._holds(0, v.at_pin):
            return None
        # Tonight's ATOM-date screen reads its aiter (with none tonight, last night's passed screen
        # reads nothing).
        screen = v.outcome == CLEAN and self._indexes[1] is not None
        if screen and (v.at_date is None or not self._holds(1, v.at_date)):
            return None
        if v.op is not None:
            name = call.ref[1][0]
            pin, date = self._indexes
            if v.op[0] != pin.op_files(name) or self._atom_op(name) != v.op[2]:
                return None
            if screen and (date is None or v.op[1] != date.op_files(name)):
                return None
        if v.history is not None:  # (the callee's blob is among `at_pin`'s facts; its history is
            # checked too: a file changed and changed back, an ATOM file re-created)
            path, born = v.history
            if path in self.history or self._born(call.path) != born:
                return None
        return v

    def _holds(self, which: int, deps: frozenset[Dep]) -> bool:
        index, same = self._indexes[which], self._same[which]
        if index is None:
            return False
        memo = self._valid[which]  # (by value: the calls of one resolution share it, in all files)
        got = memo.get(deps)
        if got is None:
            unchanged = (lambda path: path not in same) if same is not None else None
            got = memo[deps] = index.still_holds(deps, unchanged)
        return got
