"""The block structure reach reads from a file's text: which `if`/`def` blocks hold a reference."""

from __future__ import annotations

import textwrap

from pipeline.compat.reach import summarize, summarize_refs
from pipeline.compat.waivers import covers

SOURCE = textwrap.dedent(
    """
    import atom.top

    TABLE = {
        "a": "atom.table.A",
    }


    def build(
        x,
        y,
    ) -> None:
        if x:  # a comment after the colon
            from atom.under_x import a
        elif y:
            import atom.under_y
        else:
            try:
                from atom.in_try import t
            except ImportError:
                from atom.fallback import f
        from atom.in_build import b


    ENTRIES = {
        "k": (
            "atom.entry.E"
        ),
    }


    class Method:
        def forward(self):
            if self.use_triton and not self.prefill:
                return "atom.triton.Kernel"
            return None
    """
).lstrip("\n")


def _edges() -> dict[str, tuple[bool, tuple[str, ...], tuple[tuple[str, int], ...]]]:
    s = summarize(SOURCE.encode(), "atom/x.py")
    return {e.target: (e.in_function, e.guards, e.conditions) for e in s.edges}


def test_module_level_and_table_references_have_no_blocks() -> None:
    got = _edges()
    assert got["atom.top"] == (False, (), ())
    assert got["atom.table.A"] == (False, (), ())
    # An entry continued over lines after a function is the table's, not the function's.
    assert got["atom.entry.E"] == (False, (), ())


def test_conditions_follow_if_elif_else_and_except() -> None:
    got = _edges()
    assert got["atom.under_x"] == (True, ("x",), (("if x", 12),))
    assert got["atom.under_y"] == (True, ("y",), (("elif y", 14),))
    assert got["atom.in_try"] == (True, (), (("else of elif y", 16),))
    assert got["atom.fallback"] == (True, (), (("else of elif y", 16), ("except ImportError", 19)))
    # After the if/else: only the function (a multi-line signature) holds it.
    assert got["atom.in_build"] == (True, (), ())
    assert got["atom.triton.Kernel"] == (True, (), (("if self.use_triton and not self.prefill", 33),))


def test_a_waiver_condition_covers_itself_and_conjunctions_it_starts() -> None:
    ways = (("if self.use_triton",), ("if self.use_triton_decode and not prefill",))
    assert covers(["self.use_triton", "self.use_triton_decode"], ways)
    assert covers(["if self.use_triton", "if self.use_triton_decode"], ways)
    assert not covers(["self.use_triton"], ways)  # the decode way is not named
    assert not covers(["self.use_triton"], ())  # reached unconditionally: nothing to cover
    assert not covers(["self.use"], (("if self.use_triton",),))  # a prefix of a name is not a condition


PLUGIN_SOURCE = textwrap.dedent(
    """
    from . import sibling
    from ..prepare import _set_framework_backbone

    WRAPPER = f"atom.plugin.wrappers.{name}"


    def register():
        _set_framework_backbone("vllm")
        if ready:
            from .models import Model  # noqa

            return Model


    def helper():
        return "atom.plugin.vllm.table:TABLE"
    """
).lstrip("\n")


def _bare(edges: object) -> list[tuple[object, ...]]:
    return [(e.line, e.kind, e.target, e.names, e.key, e.prefix) for e in edges]  # type: ignore[attr-defined]


def test_refs_of_a_file_are_its_summary_without_the_blocks() -> None:
    # A file the walk never reaches is read for its references only: the same references (line,
    # kind, target, names, key, prefix) as its full summary, with no block context at all.
    for source, path in ((SOURCE, "atom/x.py"), (PLUGIN_SOURCE, "atom/plugin/vllm/register.py")):
        full, refs = summarize(source.encode(), path), summarize_refs(source.encode(), path)
        assert _bare(refs.edges) == _bare(full.edges)
        assert len(full.edges) >= 5
        assert all(
            not e.conditions and not e.guards and not e.in_function and not e.owner for e in refs.edges
        )
        assert refs.switch_owners == full.switch_owners
    plugin = summarize_refs(PLUGIN_SOURCE.encode(), "atom/plugin/vllm/register.py")
    assert plugin.switch_owners == ("register",)
    assert {e.target for e in plugin.edges} >= {
        "atom.plugin.vllm",
        "atom.plugin.prepare",
        "atom.plugin.wrappers",
    }
    assert [e.prefix for e in plugin.edges if e.target == "atom.plugin.wrappers"] == [True]
    # Outside atom/plugin/ no switch owners are recorded.
    assert summarize_refs(PLUGIN_SOURCE.encode(), "atom/x.py").switch_owners == ()
