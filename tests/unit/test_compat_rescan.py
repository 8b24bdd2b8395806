"""A changed ATOM file re-scanned from its previous version's scan (`scan_file_since`): equal to a full
scan field by field, whatever the edit, and re-scanning only the functions that changed."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest

from pipeline.compat import calls
from pipeline.compat.calls import FileCalls, scan_file, scan_file_since

PATH = "atom/model_ops/layer.py"

BASE = """\
import inspect

import torch
import aiter
from aiter import fused_moe, rms_norm
from aiter.ops.gemm import gemm_a8w8 as gemm

_HAS_SCALE = "scale" in inspect.signature(gemm).parameters

if hasattr(aiter, "topk_softmax"):
    _topk = aiter.topk_softmax
else:
    _topk = None


def norm(x, w):
    return rms_norm(x, w, 1e-6)


class Layer:
    def __init__(self, dim):
        self.dim = dim
        self.op = aiter.silu_and_mul

    @torch.no_grad()
    def forward(self, x, w):
        if _HAS_SCALE:
            y = gemm(x, w, scale=None)
        else:
            y = gemm(x, w)
        out = torch.empty_like(x)
        self.op(out, y)
        return norm(out, w)

    def route(self, logits, k):
        from aiter.ops.topk import biased_grouped_topk

        if _topk is not None:
            _topk(logits, k)
        return biased_grouped_topk(logits, k, True)

    def experts(self, x, w1, w2, topk_w, topk_ids):
        params = {"activation": 1}
        return fused_moe(x, w1, w2, topk_w, topk_ids, **params)


def register():
    torch.ops.aiter.my_op(1, 2)
    name = "gemm_" + "dynamic"
    getattr(aiter, name)(1)


def unrelated(a, b):
    return a + b
"""


@contextlib.contextmanager
def scanned() -> Iterator[list[str]]:
    """The names of the functions whose bodies a scan parsed and scanned."""
    names: list[str] = []
    real = calls._Scanner._scan_function_body

    def spy(self: calls._Scanner, fn, outer, cls_env):  # type: ignore[no-untyped-def]
        names.append(getattr(fn, "name", "<lambda>"))
        return real(self, fn, outer, cls_env)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calls._Scanner, "_scan_function_body", spy)
        yield names


def rescan(old: str, new: str) -> tuple[FileCalls, FileCalls, list[str]]:
    """(full scan of new, scan of new from old's scan, the functions the latter scanned but
    `__init__`, which sets `self.op` from aiter: scanned every time, for its class's environment)."""
    before = scan_file(old.encode(), PATH)
    assert before.error is None and before.units, "the earlier version must have been scanned by units"
    full = scan_file(new.encode(), PATH)
    with scanned() as names:
        got = scan_file_since(new.encode(), PATH, before)
    names = [n for n in names if n != "__init__"]
    for f in dataclasses.fields(FileCalls):  # (field by field: a difference names its field)
        assert getattr(got, f.name) == getattr(full, f.name), f.name
    assert got == full
    return full, got, names


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def lineno(text: str, needle: str) -> int:
    """The line (1-based) of the one line of `text` holding `needle`."""
    (line,) = [i for i, t in enumerate(text.split("\n"), 1) if needle in t]
    return line


def line_of(fc: FileCalls, qualname: str) -> int:
    (line,) = [c.line for c in fc.calls if c.qualname == qualname]
    return line


def test_the_base_scan_has_calls_in_every_function_and_units_for_them() -> None:
    fc = scan_file(BASE.encode(), PATH)
    names = {c.qualname for c in fc.calls}
    assert {"aiter.rms_norm", "aiter.ops.gemm.gemm_a8w8", "aiter.silu_and_mul", "aiter.fused_moe"} <= names
    assert {"aiter.ops.topk.biased_grouped_topk", "aiter.topk_softmax", "torch.ops.aiter.my_op"} <= names
    assert any(c.sig_guards for c in fc.calls)  # `if _HAS_SCALE:` guards the gemm calls
    assert fc.unchecked  # the dynamic getattr
    defs = ["def norm(", "def __init__(", "def forward(", "def route(", "def experts(", "def register("]
    assert {u.first for u in fc.units} >= {lineno(BASE, d) for d in defs}


def test_an_edited_method_is_the_only_one_scanned_and_the_ones_below_move() -> None:
    new = edit(
        BASE,
        "        if _topk is not None:\n",
        "        logits = logits.float()\n\n        if _topk is not None:\n",
    )
    full, _, names = rescan(BASE, new)
    assert names == ["route"]
    assert line_of(full, "aiter.fused_moe") == line_of(scan_file(BASE.encode(), PATH), "aiter.fused_moe") + 2
    assert line_of(full, "torch.ops.aiter.my_op") == lineno(new, "torch.ops.aiter.my_op")


def test_an_added_function_moves_everything_below_it_and_is_scanned_alone() -> None:
    new = edit(BASE, "def norm(x, w):", "def gelu(x):\n    return aiter.gelu(x)\n\n\ndef norm(x, w):")
    full, _, names = rescan(BASE, new)
    assert names == ["gelu"]
    route = [c for c in full.calls if c.qualname == "aiter.ops.topk.biased_grouped_topk"]
    assert route[0].import_line == lineno(new, "import biased_grouped_topk")  # moved with its function
    gemms = [c for c in full.calls if c.qualname == "aiter.ops.gemm.gemm_a8w8"]
    assert {g.sig_guards[0].line for g in gemms} == {lineno(new, "if _HAS_SCALE:")}  # inside forward, moved
    assert {g.import_line for g in gemms} == {lineno(new, "import gemm_a8w8")}  # the module's, where it was


def test_a_removed_function_moves_the_others_back() -> None:
    start = BASE.index("def norm(x, w):")
    new = BASE[:start] + BASE[BASE.index("class Layer:") :]
    _, _, names = rescan(BASE, new)
    assert names == []


def test_a_moved_method_and_function_are_taken_from_where_they_were() -> None:
    experts = BASE[BASE.index("    def experts(") : BASE.index("\n\ndef register():")] + "\n\n"
    new = BASE.replace(experts, "")
    new = edit(new, "    @torch.no_grad()\n", experts + "    @torch.no_grad()\n")
    register = BASE[BASE.index("def register():") : BASE.index("def unrelated(")]
    new = new.replace(register, "")
    new = edit(new, "class Layer:", register + "class Layer:")
    _, _, names = rescan(BASE, new)
    assert names == []


def test_an_import_added_above_scans_no_function_and_moves_the_import_lines_of_their_calls() -> None:
    new = edit(BASE, "import inspect\n", "import inspect\nimport os\n")
    _, got, names = rescan(BASE, new)  # (the bindings moved a line down, each as it was)
    # (but `forward`: it says `_HAS_SCALE`, a signature variable, whose value is read where it stands)
    assert names == ["forward"]
    before = {c.qualname: c.import_line for c in scan_file(BASE.encode(), PATH).calls}
    moved = {c.qualname: c.import_line for c in got.calls}
    assert moved["aiter.fused_moe"] == before["aiter.fused_moe"] + 1 == 6


def test_an_import_split_in_two_moves_each_names_calls_to_its_own_line() -> None:
    new = edit(
        BASE,
        "from aiter import fused_moe, rms_norm\n",
        "from aiter import fused_moe\nfrom aiter import rms_norm\n",
    )
    _, got, names = rescan(BASE, new)
    assert names == ["forward"]
    lines = {c.qualname: c.import_line for c in got.calls}
    assert (lines["aiter.fused_moe"], lines["aiter.rms_norm"]) == (5, 6)


def test_a_function_reading_two_names_of_a_split_import_is_scanned() -> None:
    """One old line gone to two, in one function: which a call went through only its parse says."""
    old = (
        "from aiter import fused_moe, rms_norm\n\n\ndef both(x):\n    rms_norm(x)\n    return fused_moe(x)\n"
    )
    new = edit(
        old,
        "from aiter import fused_moe, rms_norm\n",
        "from aiter import fused_moe\nfrom aiter import rms_norm\n",
    )
    full, _, names = rescan(old, new)
    assert names == ["both"]
    assert [c.import_line for c in full.calls] == [2, 1]


def test_an_edited_import_scans_the_functions_reading_its_names() -> None:
    new = edit(BASE, "from aiter import fused_moe, rms_norm", "from aiter.fused import fused_moe, rms_norm")
    full, _, names = rescan(BASE, new)
    assert sorted(names) == ["experts", "norm"]
    assert {"aiter.fused.fused_moe", "aiter.fused.rms_norm"} <= {c.qualname for c in full.calls}


def test_an_import_of_a_name_no_function_says_scans_none() -> None:
    new = edit(BASE, "from aiter import fused_moe, rms_norm", "from aiter import fused_moe, rms_norm, gelu")
    _, _, names = rescan(BASE, new)
    assert names == []


def test_a_method_setting_an_instance_attribute_changes_the_calls_of_its_siblings() -> None:
    new = edit(BASE, "self.op = aiter.silu_and_mul", "self.op = aiter.gelu_and_mul")
    full, _, _ = rescan(BASE, new)
    assert "aiter.gelu_and_mul" in {c.qualname for c in full.calls}  # forward's `self.op(...)`, unchanged


def test_an_edited_class_body_statement_is_scanned() -> None:
    new = edit(BASE, "class Layer:\n", "class Layer:\n    kind = aiter.moe_kind()\n\n")
    full, _, names = rescan(BASE, new)
    assert "aiter.moe_kind" in {c.qualname for c in full.calls}
    assert "forward" not in names


def test_a_new_guard_elsewhere_guards_the_calls_of_an_unchanged_function() -> None:
    new = edit(
        BASE,
        "    return a + b\n",
        '    if hasattr(aiter, "fused_moe"):\n        return a\n    return a + b\n',
    )
    full, _, _ = rescan(BASE, new)
    assert [c.guarded for c in full.calls if c.qualname == "aiter.fused_moe"] == [True]


def test_an_edited_decorator_is_an_edited_function() -> None:
    new = edit(BASE, "    @torch.no_grad()\n", "    @torch.inference_mode()\n")
    _, _, names = rescan(BASE, new)
    assert names == ["forward"]


def test_a_syntax_error_in_the_new_text_is_reported_as_a_full_scan_does() -> None:
    new = edit(BASE, "        if _topk is not None:\n", "        if _topk is not None\n")
    full, got, _ = rescan(BASE, new)
    assert got.error is not None and full.error == got.error


def test_a_module_level_guard_that_exits_moves_with_the_lines_above_it() -> None:
    old = edit(
        BASE,
        "\nif hasattr(aiter,",
        '\nif "x" not in inspect.signature(gemm).parameters:\n    raise ImportError\n\nif hasattr(aiter,',
    )
    at = lineno(old, '"x" not in')
    assert any(g.line == at for c in scan_file(old.encode(), PATH).calls for g in c.sig_guards)
    new = edit(old, "import inspect\n", "import inspect\nimport os\n")
    rescan(old, new)
    # The guard's test edited in place: every call below it runs under another guard.
    other = edit(old, '"x" not in inspect', '"y" not in inspect')
    full, _, _ = rescan(old, other)
    (form,) = {g.text for c in full.calls if c.qualname == "aiter.fused_moe" for g in c.sig_guards}
    assert "'y' not in" in form


@pytest.mark.parametrize("which", ["old", "new"])
def test_every_one_line_deletion_and_duplication_scans_as_in_full(which: str) -> None:
    """Each line of the base deleted, or doubled: from the base to the variant and back."""
    lines = BASE.split("\n")
    variants = []
    for i in range(len(lines)):
        variants.append("\n".join(lines[:i] + lines[i + 1 :]))
        variants.append("\n".join(lines[: i + 1] + lines[i:]))
    base = scan_file(BASE.encode(), PATH)
    for v in variants:
        data = v.encode()
        if which == "old":
            assert scan_file_since(data, PATH, base) == scan_file(data, PATH), v
        else:
            before = scan_file(data, PATH)
            assert scan_file_since(BASE.encode(), PATH, before) == base, v


def test_crlf_and_lone_carriage_returns_scan_as_in_full() -> None:
    crlf = BASE.replace("\n", "\r\n")
    new = edit(
        crlf, "        if _topk is not None:\r\n", "        x = 1\r\n        if _topk is not None:\r\n"
    )
    _, _, names = rescan(crlf, new)
    assert names == ["route"]
    lone = edit(
        BASE, "def unrelated(a, b):\n", "def unrelated(a, b):\r    a = a\n"
    )  # (a line end, for Python)
    rescan(BASE, lone)
    cr = scan_file(lone.encode(), PATH)
    assert not cr.units  # (its lines are not Python's: nothing is taken from it)
    assert scan_file_since(BASE.encode(), PATH, cr) == scan_file(BASE.encode(), PATH)


def test_a_decorator_over_several_lines_and_twin_functions_scan_as_in_full() -> None:
    twin = "    def twin(self, x):\n        return rms_norm(x, x)\n\n"
    old = edit(BASE, "    def route(", twin + "    def route(")
    old = edit(old, "def register():", "class Other:\n" + twin + "\ndef register():")
    new = edit(
        old, "    @torch.no_grad()\n", "    @torch.autocast(\n        'cuda',\n    )\n    @torch.no_grad()\n"
    )
    _, _, names = rescan(old, new)
    assert names == ["forward"]  # (its decorators start above the lines its text holds: parsed again)
    moved = edit(old, "class Other:\n" + twin, "class Other:\n    pass\n\n" + twin)
    _, _, names = rescan(old, moved)
    assert names == []


def test_a_method_defining_a_class_is_parsed_every_time() -> None:
    nested = (
        "    def make(self):\n"
        "        class Inner:\n"
        "            def run(self, x):\n"
        "                return rms_norm(x, x)\n\n"
        "        return Inner\n\n"
    )
    old = edit(BASE, "    def route(", nested + "    def route(")
    new = edit(old, "        if _topk is not None:\n", "        y = 2\n        if _topk is not None:\n")
    _, _, names = rescan(old, new)
    assert sorted(names) == ["make", "route", "run"]  # (run: Inner's method, scanned within make)


def test_from_one_edited_version_to_another_scans_as_in_full() -> None:
    """Pairs of variants (a line deleted here, another doubled there): neither is the base."""
    lines = BASE.split("\n")
    variants = [BASE.replace("\n\n\ndef ", "\n\n\ndef _pad():\n    return aiter.pad()\n\n\ndef ", 1)]
    for i in range(0, len(lines), 3):
        variants.append("\n".join(lines[:i] + lines[i + 1 :]))
        variants.append("\n".join(lines[: i + 1] + lines[i:]))
    scans = {v: scan_file(v.encode(), PATH) for v in variants}
    taken = 0
    real = calls._Scanner._take

    def count(self: calls._Scanner, *a: object) -> None:
        nonlocal taken
        taken += 1
        real(self, *a)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calls._Scanner, "_take", count)
        for a in variants[::2]:
            for b in variants[1::5]:
                assert scan_file_since(b.encode(), PATH, scans[a]) == scans[b], (a, b)
    assert taken > 100  # (most pairs share most functions: they were taken, not parsed)
