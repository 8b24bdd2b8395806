"""Guards on values derived from `inspect.signature(...)` (pipeline.compat.guards): the scanner follows a
plain chain of assignments to a form, and the form is evaluated against a signature's parameters."""

from __future__ import annotations

import textwrap

from pipeline.compat.aiterapi import Param
from pipeline.compat.calls import RawCall, SigGuard, scan_file
from pipeline.compat.guards import possible, python_params


def guards_by_call(src: str) -> dict[str, tuple[SigGuard, ...]]:
    """{the call's line as written: the guards it runs under} (each call's line is unique here)."""
    text = textwrap.dedent(src).lstrip("\n")
    fc = scan_file(text.encode(), "atom/m.py")
    assert fc.error is None, fc.error
    calls: list[RawCall] = fc.calls
    lines = text.splitlines()
    return {lines[c.line - 1].strip(): c.sig_guards for c in calls}


def forms(gs: tuple[SigGuard, ...]) -> list[tuple[object, bool]]:
    return [(g.form, g.when) for g in gs]


def P(spec: str) -> tuple[Param, ...]:
    """`a, b=, *, c` -> Params (`/` and `*` as in Python; a trailing `=` gives a default)."""
    out: list[Param] = []
    kind = "pos"
    for raw in [s.strip() for s in spec.split(",") if s.strip()]:
        if raw == "/":
            out = [Param(p.name, "posonly", p.has_default, None) for p in out]
            continue
        if raw == "*":
            kind = "kwonly"
            continue
        if raw.startswith("**"):
            out.append(Param(raw[2:], "varkw", True, None))
            continue
        if raw.startswith("*"):
            out.append(Param(raw[1:], "vararg", True, None))
            kind = "kwonly"
            continue
        out.append(Param(raw.rstrip("="), kind, raw.endswith("="), None))  # type: ignore[arg-type]
    return tuple(out)


def test_a_local_chain_from_the_signature_is_followed() -> None:
    got = guards_by_call(
        """
        import inspect

        from aiter import f

        def a(x):
            sig = inspect.signature(f)
            names = list(sig.parameters)
            if names[2] == "x":
                f(1, 2, x)

        def b(x):
            sig = inspect.signature(f)
            if len(sig.parameters) >= 5:
                f(1, 2, 3, 4, x)

        def c(x):
            build_params = inspect.signature(f).parameters
            supports_x = "x" in build_params
            if supports_x:
                f(x=x)

        def d(x):
            params = inspect.signature(f).parameters
            if params["x"].kind == inspect.Parameter.KEYWORD_ONLY:
                f(x=x, d=1)
        """
    )
    assert forms(got["f(1, 2, x)"]) == [(("at", 2, "x", None), True)]
    assert forms(got["f(1, 2, 3, 4, x)"]) == [(("len", ">=", 5, None), True)]
    assert forms(got["f(x=x)"]) == [(("in", "x", None), True)]
    assert forms(got["f(x=x, d=1)"]) == [(("kind", "x", ("kwonly",)), True)]


def test_a_module_level_flag_is_followed_into_functions() -> None:
    got = guards_by_call(
        """
        import inspect

        import aiter
        from aiter import f

        _HAS_X = "x" in inspect.signature(f).parameters
        try:
            _TAKES_Y = "y" in inspect.signature(aiter.f).parameters
        except (TypeError, ValueError):
            _TAKES_Y = False  # a fallback for a signature that cannot be read: the chain stays plain


        def a(x):
            if _HAS_X:
                f(x, 1)
            if not _TAKES_Y:
                return
            f(y=x)


        def b(x):
            _HAS_X = x  # a local of the same name shadows the module's flag
            if _HAS_X:
                f(x, 2)
        """
    )
    assert forms(got["f(x, 1)"]) == [(("in", "x", None), True)]
    assert forms(got["f(y=x)"]) == [(("not", ("in", "y", None)), False)]
    assert got["f(x, 2)"] == ()


def test_the_shim_shape_positional_names_an_index_and_a_slice() -> None:
    # ATOM's sglang shim for mla_decode_fwd_v4_nm (atom/plugin/sglang/models/deepseek_v4_attention.py).
    got = guards_by_call(
        """
        import inspect

        import aiter.mla


        def install():
            original = aiter.mla.decode
            try:
                parameters = inspect.signature(original).parameters
            except (TypeError, ValueError):
                return
            positional_names = [
                name
                for name, parameter in parameters.items()
                if parameter.kind
                in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            ]
            try:
                at = positional_names.index("lens")
            except ValueError:
                return
            if positional_names[at : at + 2] != ["lens", "max_q"]:
                return

            def shim(*args):
                return original(*args[:8], None, args[8])

            aiter.mla.decode = shim
        """
    )
    kinds = ("posonly", "pos")
    assert forms(got["return original(*args[:8], None, args[8])"]) == [
        (("in", "lens", kinds), True),
        (("not", ("slice", ("lens", 0), ("lens", 2), ("lens", "max_q"), kinds)), False),
    ]


def test_a_runtime_condition_beside_the_layout_test_is_free() -> None:
    got = guards_by_call(
        """
        import inspect
        import os

        from aiter import f

        params = inspect.signature(f).parameters
        if os.environ.get("FAST") and "x" in params:
            f(x=1)
        """
    )
    assert forms(got["f(x=1)"]) == [(("and", (("free",), ("in", "x", None))), True)]


def test_a_chain_that_is_not_plain_is_not_evaluated() -> None:
    got = guards_by_call(
        """
        import inspect

        from aiter import f


        def a(x, skip):
            names = list(inspect.signature(f).parameters)
            if skip:
                names = names[1:]
            if names[0] == "x":
                f(x, 1)
            if str(inspect.signature(f)).startswith("(x"):
                f(x, 2)
        """
    )
    (g,) = got["f(x, 1)"]
    assert g.form is None and g.text == "names[0] == 'x'"
    (h,) = got["f(x, 2)"]
    assert h.form is None


def test_forms_evaluate_with_pythons_semantics() -> None:
    ps = P("q, k, lens, max_q, /, scale=, *, sink, out=")
    pos = ("posonly", "pos")
    assert possible(("in", "sink", None), ps) == {True}
    assert possible(("in", "sink", pos), ps) == {False}
    assert possible(("len", ">=", 5, pos), ps) == {True}
    assert possible(("len", ">=", 6, pos), ps) == {False}
    assert possible(("at", 2, "lens", None), ps) == {True}
    assert possible(("at", -1, "out", None), ps) == {True}
    assert possible(("at", 9, "x", None), ps) is None  # IndexError: the test never completes
    assert possible(("pos", "max_q", "==", 3, pos), ps) == {True}
    assert possible(("pos", "nope", "==", 3, pos), ps) is None  # ValueError
    assert possible(("slice", ("lens", 0), ("lens", 2), ("lens", "max_q"), pos), ps) == {True}
    assert possible(("slice", ("lens", 0), ("lens", 2), ("lens", "scale"), pos), ps) == {False}
    assert possible(("slice", (None, 0), (None, 2), ("q", "k"), None), ps) == {True}
    assert possible(("kind", "sink", ("kwonly",)), ps) == {True}
    assert possible(("kind", "q", ("pos",)), ps) == {False}
    # Three-valued: a runtime condition is either; an unknown part decides nothing unless another does.
    free, unknown, yes, no = ("free",), ("unknown",), ("in", "q", None), ("in", "zz", None)
    assert possible(("and", (free, yes)), ps) == {True, False}
    assert possible(("and", (free, no)), ps) == {False}
    assert possible(("and", (unknown, no)), ps) == {False}
    assert possible(("and", (unknown, yes)), ps) is None
    assert possible(("or", (unknown, yes)), ps) == {True}
    assert possible(("or", (free, no)), ps) == {True, False}
    assert possible(("not", ("or", (free, yes))), ps) == {False}


def test_a_note_shows_the_parameters_as_python_writes_them() -> None:
    assert python_params(P("q, k, /, lens=, *, sink")) == "q, k, /, lens, *, sink"
    assert python_params(P("q, *rest, sink, **kw")) == "q, *rest, sink, **kw"
    assert python_params(P("q, /")) == "q, /"


def test_a_guard_on_a_torch_compile_guard_op_is_not_evaluated() -> None:
    # aiter's @torch_compile_guard returns a wrapper without functools.wraps: inspect.signature at run
    # time is not the def's, so the check cannot say what the guard sees (a warning, never a note).
    from pipeline.compat.aiterapi import Signature, Target
    from pipeline.compat.guards import guard_holds

    class Index:
        def __init__(self, op: str | None) -> None:
            self.op = op

        def resolve_ref(self, ref: object) -> Target:
            return Target("func", sig=Signature("f", "aiter/ops/f.py", 1, P("x, y"), op=self.op))

    g = SigGuard(3, '"z" in params', ("aiter", ("f",)), ("in", "z", None), True)
    assert guard_holds(g, Index(None)) is False  # type: ignore[arg-type]
    assert guard_holds(g, Index("compile_ops")) is False  # type: ignore[arg-type]
    assert guard_holds(g, Index("torch_compile_guard")) is None  # type: ignore[arg-type]
