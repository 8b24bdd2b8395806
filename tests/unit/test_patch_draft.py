"""`patch draft`'s rewrite of one call, shape by shape: what it was written for -> the pin, with libcst."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.compat.aiterapi import Signature, summarize_module
from pipeline.compat.calls import RawCall, scan_file
from pipeline.patchq.draft import (
    PLACEHOLDER,
    NotMechanical,
    placeholders_in,
    plan_call,
    rewrite_source,
    unified_diff,
)
from pipeline.patchq.model import Patch

OLD = """
def fused(qkv, w, eps, kv_cache=None, index_cache=None, block_size=0, q_out=None):
    pass

def scale_op(x, scale=1.0):
    pass

def gemm(a, b, scale=None, bias=None, out=None):
    pass

def needs(x, flag=False):
    pass

def inner(x, y=None):
    pass

def layout_op(x, shuffle: bool = False, out=None):
    pass
"""

NEW = """
def fused(qkv, w, eps, kv_cache_k=None, kv_cache_v=None, index_cache=None, block_size=0, q_out=None):
    pass

def scale_op(x, factor=1.0):
    pass

def gemm(a, b, bias=None, out=None):
    pass

def needs(x, flag, *, mode):
    pass

def inner(x, layout=None, y=None):
    pass

def layout_op(x, layout: str = "row", out=None):
    pass
"""


def sig(src: str, name: str) -> Signature:
    found = summarize_module(textwrap.dedent(src).encode(), "aiter/ops/x.py", "aiter.ops.x").find_sig(name)
    assert found is not None
    return found


def calls_in(source: str) -> list[RawCall]:
    return scan_file(source.encode(), "atom/m.py").calls


def draft(source: str) -> str:
    """Every aiter call in `source` rewritten from OLD to NEW."""
    source = textwrap.dedent(source).lstrip("\n")
    plans = [plan_call(c, sig(OLD, c.ref[1][-1]), sig(NEW, c.ref[1][-1])) for c in calls_in(source)]
    return rewrite_source(source, plans)


def test_multi_line_call_with_comments_keeps_them_and_maps_each_argument() -> None:
    out = draft(
        """
        import aiter

        def f(qkv, w, q):
            aiter.fused(  # the fused kernel
                qkv,
                w,
                1e-6,  # eps
                self.kv_cache,  # kv_cache (one tensor)
                self.index_cache,  # index_cache
                # the block size comes from the cache
                self.kv_cache.shape[2],
                q,
            )
        """
    )
    assert out == textwrap.dedent(
        """\
        import aiter

        def f(qkv, w, q):
            aiter.fused(  # the fused kernel
                qkv,
                w,
                1e-6,  # eps
                kv_cache_k=self.kv_cache,  # kv_cache (one tensor)
                kv_cache_v=PIPELINE_DRAFT_TODO,
                index_cache=self.index_cache,  # index_cache
                # the block size comes from the cache
                block_size=self.kv_cache.shape[2],
                q_out=q,
            )
        """
    )


def test_the_plan_says_what_a_person_must_review() -> None:
    (c,) = calls_in("import aiter\naiter.fused(a, b, c, kv, ic, 4, q)\n")
    plan = plan_call(c, sig(OLD, "fused"), sig(NEW, "fused"))
    assert plan.keep == 3
    assert [k for _, k in plan.keywords] == ["kv_cache_k", "index_cache", "block_size", "q_out"]
    assert any("`kv_cache` is now `kv_cache_k`" in n for n in plan.notes)
    # `kv` was the whole kv_cache, which aiter split in two: the other half is a person's to write
    assert plan.placeholders == ("kv_cache_v",) and plan.after == (("kv_cache_v", "kv_cache_k"),)
    assert any(
        "`kv_cache` was split into `kv_cache_k`, `kv_cache_v`: `kv` was the whole" in n for n in plan.notes
    )
    # passing None for the whole passes None for each part: nothing to split, nothing to write
    (none,) = calls_in("import aiter\naiter.fused(a, b, c, None, ic, 4, q)\n")
    plan = plan_call(none, sig(OLD, "fused"), sig(NEW, "fused"))
    assert plan.placeholders == () and any("`kv_cache_v` is new" in n for n in plan.notes)


def test_renamed_keyword_and_removed_parameter() -> None:
    out = draft(
        """
        import aiter
        y = aiter.scale_op(x, scale=2.0)
        z = aiter.gemm(x, w, self.scale, self.bias)
        """
    )
    assert "aiter.scale_op(x, factor=2.0)" in out
    assert "aiter.gemm(x, w, bias=self.bias)" in out  # `scale` is gone: its argument dropped


def test_new_required_parameters_get_placeholders_that_bind_nothing() -> None:
    src = "import aiter\naiter.needs(x)\naiter.needs(\n    x,\n)\naiter.needs(x, **extra)\n"
    out = draft(src)
    assert f"aiter.needs(x, flag={PLACEHOLDER}, mode={PLACEHOLDER})" in out
    # the call's own one-argument-per-line layout is kept
    assert f"aiter.needs(\n    x,\n    flag={PLACEHOLDER},\n    mode={PLACEHOLDER},\n)" in out
    assert out.endswith("aiter.needs(x, **extra)\n")  # `**extra` may hold them: nothing to invent
    (c, _, _) = calls_in(src)
    plan = plan_call(c, sig(OLD, "needs"), sig(NEW, "needs"))
    assert plan.placeholders == ("flag", "mode")
    assert any("it had a default in the signature the call was written for" in n for n in plan.notes)


def test_star_args() -> None:
    (shifted, renamed) = calls_in("import aiter\naiter.gemm(x, w, s, *rest)\naiter.scale_op(*xs, scale=s)\n")
    with pytest.raises(NotMechanical, match=r"\*args"):
        plan_call(shifted, sig(OLD, "gemm"), sig(NEW, "gemm"))
    plan = plan_call(renamed, sig(OLD, "scale_op"), sig(NEW, "scale_op"))
    assert plan.renamed == (("scale", "factor"),)
    out = rewrite_source("import aiter\naiter.gemm(x, w, s, *rest)\naiter.scale_op(*xs, scale=s)\n", [plan])
    assert out == "import aiter\naiter.gemm(x, w, s, *rest)\naiter.scale_op(*xs, factor=s)\n"


def test_nested_calls_both_rewritten_and_other_calls_untouched() -> None:
    out = draft(
        """
        import aiter
        aiter.fused(
            torch.cat([a, b]),
            w,
            g(h(1), 2),
            aiter.inner(x, self.y),
            None,
            0,
            q,
        )
        """
    )
    assert out == textwrap.dedent(
        """\
        import aiter
        aiter.fused(
            torch.cat([a, b]),
            w,
            g(h(1), 2),
            kv_cache_k=aiter.inner(x, y=self.y),
            kv_cache_v=PIPELINE_DRAFT_TODO,
            index_cache=None,
            block_size=0,
            q_out=q,
        )
        """
    )


def test_a_call_not_found_where_the_check_saw_it_is_refused() -> None:
    (c,) = calls_in("import aiter\naiter.scale_op(x, scale=2.0)\n")
    plan = plan_call(c, sig(OLD, "scale_op"), sig(NEW, "scale_op"))
    with pytest.raises(NotMechanical, match="not found"):
        rewrite_source("import aiter\n\naiter.scale_op(x, scale=2.0)\n", [plan])


def test_placeholders_are_found_in_a_patch_by_their_line(tmp_path: object) -> None:
    before = "import aiter\n\n\naiter.needs(x)\n"
    after = draft(before)
    diff = unified_diff("atom/m.py", before, after)
    text = (
        "From: a <a@b.c>\nSubject: DRAFT\nStatus: draft\nX-Atom-Range: abcdef1..\nX-Patch-Version: 1\n\n"
        "body\n---\n" + diff
    )
    from pathlib import Path

    patch = Patch.parse(text.encode(), path=Path("0001-draft.patch"))
    assert placeholders_in(patch) == [f"atom/m.py:4 `aiter.needs(x, flag={PLACEHOLDER}, mode={PLACEHOLDER})`"]


def test_a_statement_with_a_string_less_indented_than_itself_is_rewritten_in_the_whole_module() -> None:
    src = "import aiter\n\n\nclass A:\n    def f(self):\n" + (
        '        aiter.scale_op("""\nleft\n""", scale=2.0)\n'
    )
    assert draft(src) == src.replace("scale=2.0", "factor=2.0")
    # and in a block, two calls in nested statements: one span, both rewritten
    block = "import aiter\nif aiter.scale_op(x, scale=1):\n" + (
        "    aiter.scale_op(\n        y,\n        scale=2,\n    )\n"
    )
    assert draft(block) == block.replace("scale=", "factor=")


def test_a_value_written_for_another_type_is_a_placeholder_not_carried_over() -> None:
    # aiter e4048607a5: `scale_shuffle: bool` became `scale_layout: str = "row"` in the same slot
    out = draft(
        "import aiter\naiter.layout_op(x, shuffle=False)\naiter.layout_op(x, True)\naiter.layout_op(x, s)\n"
    )
    assert out.splitlines()[1:] == [
        f"aiter.layout_op(x, layout={PLACEHOLDER})",
        f"aiter.layout_op(x, layout={PLACEHOLDER})",
        "aiter.layout_op(x, layout=s)",  # its type is not evident: carried over, with a note to check
    ]
    (c, _, _) = calls_in(
        "import aiter\naiter.layout_op(x, shuffle=False)\naiter.layout_op(x, True)\naiter.layout_op(x, s)\n"
    )
    plan = plan_call(c, sig(OLD, "layout_op"), sig(NEW, "layout_op"))
    assert plan.placeholders == ("layout",)
    # in place, where the value was, with the rest of the call as it was
    spread = "import aiter\naiter.layout_op(\n    x,\n    shuffle=False,  # plain rows\n    out=y,\n)\n"
    assert draft(spread) == spread.replace("shuffle=False", f"layout={PLACEHOLDER}")
    assert any(
        "`False` (bool) was written for `shuffle: bool`; `layout: str` takes another type" in n
        for n in plan.notes
    )
