"""The ATOM call finder: every import style, guards, wrappers, scopes (no git: sources as bytes)."""

from __future__ import annotations

import textwrap

from pipeline.compat.calls import RawCall, scan_file


def calls_of(src: str, path: str = "atom/m.py") -> list[RawCall]:
    fc = scan_file(textwrap.dedent(src).lstrip("\n").encode(), path)
    assert fc.error is None, fc.error
    return fc.calls


def qual(calls: list[RawCall]) -> list[tuple[int, str]]:
    return [(c.line, c.qualname) for c in sorted(calls, key=lambda c: c.line)]


def test_every_import_style_resolves_to_the_aiter_path() -> None:
    calls = calls_of(
        """
        import aiter
        import aiter as a
        from aiter import f
        from aiter import f as g
        from aiter.ops.x import h
        import aiter.ops.x as m
        import aiter.ops.y

        def run(t):
            aiter.f(t)
            a.f(t)
            f(t)
            g(t)
            h(t)
            m.h(t)
            aiter.ops.x.h(t)
            aiter.ops.y.k(t)
        """
    )
    assert qual(calls) == [
        (10, "aiter.f"),
        (11, "aiter.f"),
        (12, "aiter.f"),
        (13, "aiter.f"),
        (14, "aiter.ops.x.h"),
        (15, "aiter.ops.x.h"),
        (16, "aiter.ops.x.h"),
        (17, "aiter.ops.y.k"),
    ]


def test_imports_inside_functions_and_closures() -> None:
    calls = calls_of(
        """
        def outer(x, flag):
            if flag:
                from aiter.ops.gemm import gemm_fp4
                from aiter.ops.quant import quant

            def inner(y):
                return gemm_fp4(quant(y), y)

            return inner(x)

        def other(x):
            return gemm_fp4(x)  # not imported here: not aiter's
        """
    )
    assert sorted(qual(calls)) == [(7, "aiter.ops.gemm.gemm_fp4"), (7, "aiter.ops.quant.quant")]


def test_try_importerror_and_hasattr_guards() -> None:
    calls = calls_of(
        """
        import aiter
        try:
            from aiter import maybe
        except ImportError:
            maybe = None
        from aiter import sure

        def use(x):
            if maybe is not None:
                maybe(x)
            sure(x)
            if hasattr(aiter, "opt"):
                aiter.opt(x)
            fn = getattr(aiter, "opt2", None)
            if fn is not None:
                fn(x)
            aiter.plain(x)
        """
    )
    guarded = {c.qualname: c.guarded for c in calls}
    assert guarded == {
        "aiter.maybe": True,
        "aiter.sure": False,
        "aiter.opt": True,
        "aiter.opt2": True,
        "aiter.plain": False,
    }


def test_wrappers_aliases_and_instance_attributes() -> None:
    calls = calls_of(
        """
        import aiter
        from aiter.mla import mla_decode_fwd
        from atom.utils import mark_trace

        mla_decode_fwd = mark_trace(mla_decode_fwd, prefix="mla", torch_compile=False)
        alias = aiter.gemm

        class Layer:
            def __init__(self, ok):
                self.fa = aiter.flash_attn
                self._pre = getattr(aiter, "mhc_pre", None) if ok else None

            def forward(self, x):
                mla_decode_fwd(x)
                alias(x)
                self.fa(x)
                self._pre(x)
        """
    )
    got = {c.qualname: c.guarded for c in calls}
    assert got == {
        "aiter.mla.mla_decode_fwd": False,
        "aiter.gemm": False,
        "aiter.flash_attn": False,
        "aiter.mhc_pre": True,
    }


def test_shadowing_parameters_and_local_definitions_are_not_aiter() -> None:
    calls = calls_of(
        """
        from aiter import gemm, act

        def f(gemm):
            gemm(1, 2, 3)

        def g(x):
            act = make_act()
            act(x)

        def h(x):
            gemm(x)
        """
    )
    assert qual(calls) == [(11, "aiter.gemm")]


def test_star_args_and_dynamic_getattr() -> None:
    fc = scan_file(
        b"import aiter\n\ndef f(x, name, a, k):\n"
        b"    getattr(aiter, name)(x)\n    aiter.g(*a)\n    aiter.g(x, **k)\n",
        "atom/m.py",
    )
    assert [u.reason for u in fc.unchecked] == ["dynamic getattr on aiter"]
    star = sorted((c.star_args, c.star_kwargs) for c in fc.calls)
    assert star == [(False, True), (True, False)]


def test_evident_argument_types() -> None:
    (call,) = calls_of(
        """
        import torch
        import aiter

        def f(x, n):
            q = torch.empty((x.shape[0], 4))
            aiter.k(None, 0, 1.5, "s", True, x.shape[1], x.size(0), len(x), q, n, -1, [1], (1,))
        """
    )
    assert [a.etype for a in call.args] == [
        "None", "int", "float", "str", "bool", "int", "int", "int", "Tensor", None, "int", "list", "tuple",
    ]  # fmt: skip


def test_reassigned_local_has_no_evident_type() -> None:
    (call,) = calls_of(
        """
        import torch
        import aiter

        def f(x, c):
            q = torch.empty(4)
            if c:
                q = 0
            aiter.k(q)
        """
    )
    assert call.args[0].etype is None


def test_file_without_aiter_is_not_parsed_and_syntax_error_is_reported() -> None:
    assert scan_file(b"def f(:\n", "atom/x.py").error is None  # never says aiter: skipped
    fc = scan_file(b"import aiter\ndef f(:\n    aiter.g()\n", "atom/x.py")
    assert fc.error is not None and "line 2" in fc.error
    assert fc.calls == []


def test_line_numbers_survive_body_stripping() -> None:
    src = "import aiter\n\n\ndef unrelated():\n    x = 1\n    return x\n\n\ndef f(t):\n    aiter.g(t)\n"
    (call,) = scan_file(src.encode(), "atom/x.py").calls
    assert (call.line, call.col) == (10, 5)


def test_files_that_only_mention_aiter_are_skipped_but_any_import_form_counts() -> None:
    assert scan_file(b"import torch\n\ndef f(x):\n    return rocm_aiter_k(x)\n", "atom/a.py").calls == []
    # An op registered as `aiter::k` is reached without any import of aiter.
    (op,) = scan_file(b"import torch\n\ndef f(x):\n    return torch.ops.aiter.k(x)\n", "atom/a.py").calls
    assert op.qualname == "torch.ops.aiter.k"
    (c,) = scan_file(b"import torch, aiter\n\ndef f(x):\n    return aiter.k(x)\n", "atom/b.py").calls
    assert c.qualname == "aiter.k"


def test_chains_from_calls_variables_and_attributes_keep_the_call_in_the_reference() -> None:
    calls = calls_of(
        """
        from aiter.dist.parallel_state import get_tp_group
        import aiter


        class L:
            def __init__(self):
                self.tp = get_tp_group()

            def f(self, y):
                get_tp_group().all_reduce(y)
                g = aiter.make()
                g.send(y, 1)
                self.tp.broadcast(y)
        """
    )
    assert sorted(qual(calls)) == [
        (7, "aiter.dist.parallel_state.get_tp_group"),
        (10, "aiter.dist.parallel_state.get_tp_group"),
        (10, "aiter.dist.parallel_state.get_tp_group().all_reduce"),
        (11, "aiter.make"),
        (12, "aiter.make().send"),
        (13, "aiter.dist.parallel_state.get_tp_group().broadcast"),
    ]
    (send,) = [c for c in calls if c.qualname.endswith("send")]
    assert send.ref == ("aiter", ("make", "()", "send"))


def test_star_arguments_keep_what_can_be_checked() -> None:
    calls = calls_of(
        """
        import aiter


        def f(x, rest, kw):
            aiter.a(x, *rest, k=1)
            aiter.b(x, **{"m": "s", "n": 2})
            opts = dict(m="s")
            aiter.c(x, **opts)
            changed = {"m": "s"}
            changed["n"] = 2
            aiter.d(x, **changed)
            aiter.e(*(x, 1), **kw)
        """
    )
    by = {c.qualname.rsplit(".", 1)[-1]: c for c in calls}
    a, b, c, d, e = (by[k] for k in "abcde")
    assert ([x.text for x in a.args], [k for k, _ in a.kwargs], a.star_args) == (["x"], ["k"], True)
    assert ([k for k, _ in b.kwargs], b.star_kwargs) == (["m", "n"], False)  # a literal: written out
    assert ([k for k, _ in c.kwargs], c.star_kwargs) == (["m"], False)  # a local literal never changed
    assert (d.kwargs, d.star_kwargs) == ((), True)  # changed after its literal: unknown keys
    assert ([x.text for x in e.args], e.star_args, e.star_kwargs) == (["x", "1"], False, True)
    assert e.args[1].etype == "int"


def test_torch_ops_aiter_and_the_ops_atom_registers_itself() -> None:
    fc = scan_file(
        textwrap.dedent(
            """
            import torch
            from atom.utils import mark_spliting_op

            ops = torch.ops.aiter


            @mark_spliting_op(
                is_custom=True,
            )
            def own_op(x: torch.Tensor) -> torch.Tensor:
                return x


            def f(x):
                ops.rms_norm(x, 1e-6)
                torch.ops.aiter.own_op.default(x)
            """
        ).encode(),
        "atom/o.py",
    )
    assert [(c.qualname, c.ref) for c in fc.calls] == [
        ("torch.ops.aiter.rms_norm", ("torch.ops.aiter", ("rms_norm",))),
        ("torch.ops.aiter.own_op.default", ("torch.ops.aiter", ("own_op", "default"))),
    ]
    assert fc.ops == ("own_op",)


def test_a_body_is_kept_when_it_calls_aliases_or_passes_on_a_bound_name() -> None:
    from pipeline.compat.calls import _may_call

    bound = {b"f", b"mod", b"qk"}
    kept = [
        b"    return f(x)",  # a call
        b"    y = mod.sub.g (x)",  # the first name of a dotted chain before `(`
        b"    self.qk(x)",  # a name after a dot, called
        b"    h = f",  # aliased
        b"    run(x,\n        f)",  # passed on
        b"    import aiter",  # says `aiter`
    ]
    dropped = [
        b"    return fx(x) + xf(y)",  # only as part of other words
        b"    d = 2 * mod.table",  # a plain attribute read is not a call
        b"    return x.f",  # nor is an attribute of something else, read
        b"    s = 'rocm_aiter'",  # `aiter` inside another word
    ]
    assert [_may_call(b, bound) for b in kept] == [True] * len(kept)
    assert [_may_call(b, bound) for b in dropped] == [False] * len(dropped)


def test_guarded_names_are_found_where_hasattr_or_getattr_starts() -> None:
    from pipeline.compat.calls import _guarded_names

    text = textwrap.dedent(
        """
        if hasattr( aiter , "fused_a" ):
            pass
        g = getattr(aiter.ops, 'fused_b', None)
        x = myhasattr(aiter, "not_a_guard")
        y = getattr(aiter, "no_default")
        """
    )
    assert _guarded_names(text) == {"fused_a", "fused_b"}


def test_the_body_test_agrees_with_the_regex_it_replaced_on_generated_bodies() -> None:
    import random
    import re

    from pipeline.compat.calls import _may_call

    names = ["aiter", "f", "mod", "qk", "f2"]
    alt = b"|".join(re.escape(n.encode()) for n in sorted(names))
    oracle = re.compile(rb"\baiter\b|\b(?:" + alt + rb")\b(?:\s*\.\s*\w+)*\s*\(|[=(,]\s*(?:" + alt + rb")\b")
    words = ["f", "mod", "qk", "f2", "xf", "fx", "aiter", "raiter", "x", "1"]
    pieces = [*words, ".", " ", "\n", "(", ")", "=", ",", "+"]
    rng = random.Random(12)
    bodies = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))).encode() for _ in range(4000)]
    bound = {n.encode() for n in names}
    disagree = [b for b in bodies if _may_call(b, bound) != bool(oracle.search(b))]
    assert disagree == []


def test_signature_guards_are_recorded_with_their_plain_form() -> None:
    calls = calls_of(
        """
        import inspect

        import aiter
        from aiter import f, g

        params = inspect.signature(f).parameters
        if "z" in params:
            f(1, 2, 3)
        else:
            f(1, 2)
        if not len(inspect.signature(aiter.g).parameters) >= 2 or "y" in inspect.signature(g).parameters:
            g(1)
        if inspect.signature(len).parameters:
            g(2)  # a guard on a function that is not aiter's says nothing of aiter's layout


        def install():
            try:
                at = list(inspect.signature(f).parameters).index("k")
            except ValueError:
                return
            f(at)
        """
    )
    by_line = {c.line: c.sig_guards for c in calls}
    (g1,) = by_line[8]
    assert (g1.ref, g1.form, g1.when, g1.line) == (("aiter", ("f",)), ("in", "z", None), True, 7)
    assert [(g.form, g.when) for g in by_line[10]] == [(("in", "z", None), False)]
    (g3,) = by_line[12]
    # the same function, both parts
    assert g3.form == ("or", (("not", ("len", ">=", 2, None)), ("in", "y", None)))
    assert by_line[14] == ()
    (g4,) = by_line[22]  # `.index("k")` did not raise: "k" is a parameter
    assert (
        g4.form == ("in", "k", None)
        and g4.text.startswith("at = list(inspect.signature(f)")
        and g4.line == 19
    )
