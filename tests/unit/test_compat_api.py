"""aiter signature index, binding, type evidence, change explanations, body stripping, reports."""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from pipeline.compat.aiterapi import ApiIndex, Signature, pretty_annotation, summarize_module
from pipeline.compat.bind import annotation_types, bind
from pipeline.compat.calls import scan_file
from pipeline.compat.cause import describe_changes, explain, shifted_args
from pipeline.compat.pysource import SummaryCache, Tree, strip_bodies
from pipeline.compat.report import CauseInfo, CheckReport, Finding, Unparseable
from pipeline.gitw import CommitInfo, GitRepo


class FakeRepo:
    """Blobs by SHA, like GitRepo.read_blobs (unit tests start no git process)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.path = "fake-aiter"  # one repository, at several commits
        self.blobs: dict[str, bytes] = {}
        self.tree: dict[str, str] = {}
        for path, text in files.items():
            data = textwrap.dedent(text).lstrip("\n").encode()
            sha = hashlib.sha1(data).hexdigest()
            self.blobs[sha] = data
            self.tree[path] = sha

    def read_blobs(self, shas: Sequence[str]) -> Iterator[tuple[str, bytes]]:
        for s in shas:
            yield s, self.blobs[s]


def index_of(files: dict[str, str]) -> ApiIndex:
    repo = FakeRepo(files)
    tree = Tree(cast(GitRepo, repo), "0" * 40, repo.tree)
    return ApiIndex(tree, SummaryCache("aiter", None))


def sig(src: str, name: str) -> Signature:
    s = summarize_module(textwrap.dedent(src).encode(), "aiter/x.py", "aiter.x")
    for ev_name, kind, payload, _ in s.events:
        if ev_name == name and kind == "def":
            assert isinstance(payload, Signature)
            return payload
    raise AssertionError(name)


def call(src: str) -> Any:
    fc = scan_file(("import aiter\n" + textwrap.dedent(src)).encode(), "atom/m.py")
    assert len(fc.calls) == 1, fc.calls
    return fc.calls[0]


AITER = {
    "aiter/__init__.py": """
        from .jit.core import compile_ops
        from .ops.a import *
        from .ops.b import *
        from .ops.c import *
        from .ops.dyn import *
        from .ops.norm import rms_norm as rmsnorm
        from . import mla
        try:
            from .ops.optional import opt_fn
        except ImportError:
            opt_fn = None
        """,
    "aiter/jit/__init__.py": "",
    "aiter/jit/core.py": "def compile_ops(*a, **k):\n    return lambda f: f\n",
    "aiter/ops/__init__.py": "",
    "aiter/ops/a.py": """
        from ..jit.core import compile_ops

        @compile_ops("m", fc_name="fused")
        def fused(x: Tensor, n: int, *, flag: bool = False) -> None:
            pass

        def _private(x):
            pass
        """,
    "aiter/ops/b.py": """
        __all__ = ["exported"]

        def exported(x):
            pass

        def not_exported(x):
            pass

        def fused(x):  # not in __all__: a's fused stays
            pass
        """,
    "aiter/ops/dyn.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
    "aiter/ops/c.py": "def fused(y):  # a later star import: wins\n    pass\n",
    "aiter/ops/norm.py": "def rms_norm(x, w, eps: float = 1e-6):\n    pass\n",
    "aiter/ops/optional.py": "def opt_fn(x):\n    pass\n",
    "aiter/mla.py": "def mla_decode_fwd(q, kv, o, *, sm_scale: float = 1.0):\n    pass\n",
    "aiter/ops/triton/__init__.py": """
        import sys
        _BACKWARD_COMPAT_MAP = {"old_mod": "basic.new_mod"}

        def __getattr__(name):
            raise AttributeError(name)
        """,
    "aiter/ops/triton/basic/new_mod.py": "def kernel(a, b):\n    pass\n",
    "aiter/utility/fp4_utils.py": "def e8m0_to_f32(s):\n    pass\n",
}


def test_reexports_aliases_all_and_star_order() -> None:
    idx = index_of(AITER)
    assert idx.resolve(("rmsnorm",)).sig is not None
    assert idx.resolve(("rmsnorm",)).sig.name == "rms_norm"  # type: ignore[union-attr]
    assert (
        idx.resolve(("exported",)).kind == "func"
    )  # a later `import *` of a __getattr__ module hides nothing
    assert idx.resolve(("not_exported",)).kind == "missing"  # __all__ of ops/b.py
    assert idx.resolve(("_private",)).kind == "missing"  # star import skips _names
    fused = idx.resolve(("fused",))
    assert fused.sig is not None and fused.sig.path == "aiter/ops/c.py"  # the later star import wins
    assert idx.resolve(("mla", "mla_decode_fwd")).kind == "func"
    assert idx.resolve(("opt_fn",)).kind == "func"  # `opt_fn = None` fallback is not a definition
    assert idx.resolve(("nope",)).kind == "missing"


def test_decorated_function_keeps_its_written_signature() -> None:
    idx = index_of(AITER)
    s = idx.resolve(("ops", "a", "fused")).sig  # aiter.ops.a.fused, decorated
    assert s is not None
    assert [(p.name, p.kind) for p in s.params] == [("x", "pos"), ("n", "pos"), ("flag", "kwonly")]


def test_compat_module_alias_and_namespace_package() -> None:
    idx = index_of(AITER)
    t = idx.resolve_module_path("aiter.ops.triton.old_mod")
    assert t.kind == "module" and t.module == "aiter.ops.triton.basic.new_mod"
    assert idx.resolve_module_path("aiter.utility.fp4_utils").kind == "module"  # no utility/__init__.py
    assert idx.resolve_module_path("aiter.utility.nothing").kind == "missing"
    # a package with __getattr__ may define anything: unknown, never "missing"
    assert idx.resolve(("ops", "triton", "whatever")).kind == "unknown"


def test_bind_rules() -> None:
    s = sig("def f(a, b, c=1, *, d, e=2):\n    pass\n", "f")
    assert bind(call("aiter.f(1, 2, d=3)"), s).ok
    kinds = lambda src: [p.kind for p in bind(call(src), s).problems]  # noqa: E731
    assert kinds("aiter.f(1, 2, 3, 4, d=1)") == ["too-many-positional"]
    assert kinds("aiter.f(1, 2)") == ["missing-argument"]
    assert kinds("aiter.f(1, 2, d=1, z=2)") == ["unexpected-keyword"]
    assert kinds("aiter.f(1, 2, b=2, d=1)") == ["duplicate-argument"]
    p = sig("def g(a, /, b):\n    pass\n", "g")
    assert [x.kind for x in bind(call("aiter.g(a=1, b=2)"), p).problems][:1] == ["positional-only-as-keyword"]
    v = sig("def h(a, *rest, **kw):\n    pass\n", "h")
    assert bind(call("aiter.h(1, 2, 3, x=4)"), v).ok


def test_evident_types_against_annotations() -> None:
    s = sig(
        "def f(t: Tensor, o: Optional[Tensor], u: Tensor | None, n: int, x: float, s: str, b: bool,"
        " d: Tensor = None):\n    pass\n",
        "f",
    )
    ok = call("aiter.f(None if c else t, None, None, 0, 1, 's', True, None)")
    assert bind(ok, s).ok, bind(ok, s).problems  # int for float, None for `= None` defaults
    # 0 for a bool: an op schema rejects it, and in ATOM it was a `dim` meant for the next slot
    flag = call("aiter.f(t, None, None, 0, 1, 's', 0)")
    assert [p.message for p in bind(flag, s).problems] == ["argument 7 `0` (int) lands on `b: bool`"]
    bad = call("aiter.f(None, 0, None, 1.5, 's', 2, True)")
    msgs = [p.message for p in bind(bad, s).problems]
    assert msgs == [
        "argument 1 `None` (None) lands on `t: Tensor`",
        "argument 2 `0` (int) lands on `o: Tensor | None`",
        "argument 4 `1.5` (float) lands on `n: int`",
        "argument 5 `'s'` (str) lands on `x: float`",
        "argument 6 `2` (int) lands on `s: str`",
    ]
    assert annotation_types("Optional[torch.Tensor]") == {"Tensor", "None"}
    assert annotation_types("SomethingElse") is None
    assert pretty_annotation("Optional[torch.Tensor]") == "Tensor | None"


def test_describe_changes_each_kind() -> None:
    old = sig("def f(a, b, c=0, d=0, e=0):\n    pass\n", "f")

    def changes(new_src: str) -> list[str]:
        return [c for c, _ in describe_changes(old, sig(new_src, "f"))]

    assert changes("def f(a, b, x=0, c=0, d=0, e=0):\n    pass\n") == ["`x` inserted at position 3"]
    assert changes("def f(a, c=0, d=0, e=0):\n    pass\n") == ["`b` removed (was position 2)"]
    assert changes("def f(a, bb, c=0, d=0, e=0):\n    pass\n") == ["`b` renamed to `bb` (position 2)"]
    assert changes("def f(a, b, c, d=0, e=0):\n    pass\n") == ["`c` made required"]
    assert changes("def f(a, b, c=0, *, d=0, e=0):\n    pass\n") == [
        "`d` made keyword-only",
        "`e` made keyword-only",
    ]
    moved = changes("def f(a, b, d=0, c=0, e=0):\n    pass\n")
    assert any("moved" in m for m in moved)


def test_a_parameter_renamed_in_place_is_not_a_shift() -> None:
    old = sig("def f(x, w, scale=None, out=None):\n    pass\n", "f")
    renamed = sig("def f(x_fp4, w, scale=None, out=None):\n    pass\n", "f")
    inserted = sig("def f(x, w, bias=None, scale=None, out=None):\n    pass\n", "f")
    c = call("aiter.f(a, b, s, o)")
    assert shifted_args(old, renamed, c) == []
    assert shifted_args(old, inserted, c) == [3, 4]


def test_explain_names_the_shift_and_where_an_argument_lands() -> None:
    old = sig("def f(q, k, kv_cache=None, index_cache=None, block_size: int = 0, out=None):\n    pass\n", "f")
    new = sig(
        "def f(q, k, kv_cache_k=None, kv_cache_v=None, index_cache: Optional[Tensor] = None,"
        " block_size: int = 0, out=None):\n    pass\n",
        "f",
    )
    change, effect = explain(old, new, call("aiter.f(q, k, None, None, 0, out)"), "f")
    assert change == "kv_cache_v inserted at position 4"
    assert "positional arguments 4–6 of this call now bind one slot later" in effect
    assert "argument 5 `0` (int) lands on `index_cache: Tensor | None`" in effect


def test_strip_bodies_keeps_signatures_and_line_numbers() -> None:
    src = textwrap.dedent(
        '''
        import x

        @deco(1)
        def f(a: int = (1, 2),
              b: str = ")"):  # comment
            """doc
        unindented doc line
            """
            return a

        class C:
            def m(self, x): return x

            def n(self, y):
                z = 1
                return z

        def g(): pass
        '''
    ).encode()
    out = strip_bodies(src)
    assert out is not None and out.count(b"\n") == src.count(b"\n")
    full, stripped = ast.parse(src), ast.parse(out)
    dump = lambda t: [  # noqa: E731
        (n.name, n.lineno, ast.dump(n.args)) for n in ast.walk(t) if isinstance(n, ast.FunctionDef)
    ]
    assert dump(full) == dump(stripped)
    assert b"return a" not in out and b"z = 1" not in out
    kept = strip_bodies(src, keep=lambda body: b"return a" in body)
    assert kept is not None and b"return a" in kept and b"z = 1" not in kept


def _report() -> CheckReport:
    c = CommitInfo(
        "08f04b889a332ecd102c39ed1d76fd1c057d8040", datetime(2026, 6, 23, tzinfo=UTC), "split kv", "x"
    )
    f = Finding(
        "atom/models/minimax_m3.py", 418, 13, "aiter.fused_qknorm_idxrqknorm", "error", "positional-shift",
        "kv_cache_v inserted at position 15", ("argument 16 `0` (int) lands on `index_cache`",),
        CauseInfo(c, "26d4061181b18b20617d1aec4e21dca1c9f359d1", "kv_cache_v inserted at position 15", ""),
    )  # fmt: skip
    w = Finding("atom/a.py", 3, 1, "aiter.act", "warning", "missing-function", "guarded")
    return CheckReport([f, w], 10, 2, [Unparseable("atom", "atom/b.py", "line 1: bad")], "a" * 40, "b" * 40)


def test_json_report_fields() -> None:
    r = _report()
    d = json.loads(json.dumps(r.to_json()))
    assert d["calls_checked"] == 10 and d["calls_unchecked"] == 2 and d["compatible"] is False
    f = d["findings"][0]
    for key in ("path", "line", "function", "severity", "kind", "message"):
        assert f[key]
    assert f["cause"]["commit"] == "08f04b889a332ecd102c39ed1d76fd1c057d8040"
    assert d["findings"][1]["cause"] is None


def test_sarif_is_2_1_0_shaped_for_code_scanning() -> None:
    s = json.loads(json.dumps(_report().to_sarif()))
    assert s["version"] == "2.1.0" and s["$schema"].endswith("sarif-2.1.0.json")
    (run,) = s["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    for res in run["results"]:
        assert res["ruleId"] in ids and ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in ("error", "warning", "note")
        assert res["message"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        assert not loc["artifactLocation"]["uri"].startswith("/")
        assert loc["region"]["startLine"] >= 1
    assert [r["level"] for r in run["results"]] == ["error", "warning", "warning"]


@pytest.mark.parametrize("ann", ["int", "Optional[int]", "List[int]", "Union[int, str]", "x.Tensor | None"])
def test_annotation_types_never_crash(ann: str) -> None:
    assert annotation_types(ann) is not None


def test_none_literals_moving_between_none_defaults_is_not_a_shift() -> None:
    old = sig("def f(x, k_scale=None, v_scale=None):\n    pass\n", "f")
    new = sig("def f(x, dtype: Optional[str] = None, k_scale=None, v_scale=None):\n    pass\n", "f")
    assert shifted_args(old, new, call("aiter.f(a, None, None)")) == []
    assert shifted_args(old, new, call("aiter.f(a, s, None)")) == [2, 3]


def test_objects_resolve_through_return_annotations_simple_returns_singletons_and_bases() -> None:
    idx = index_of(
        {
            "aiter/__init__.py": "",
            "aiter/g.py": """
            import logging
            import torch
            from .base import Base


            class Group(Base):
                def __init__(self, ranks):
                    self.ranks = ranks
                    self.comm = None

                def all_reduce(self, x: torch.Tensor, fp8: bool = False) -> torch.Tensor:
                    return x

                def echo(self, x: torch.Tensor):
                    return x

                @staticmethod
                def make(n: int) -> "Group": ...

                @property
                def size(self) -> int: ...


            _G: Group | None = None
            log = logging.getLogger("aiter")
            table = {"a": 1}


            def get_group() -> Group:
                return _G


            def plain():
                return Group([0])
            """,
            "aiter/base.py": """
            class Base:
                def barrier(self, timeout: float = 1.0): ...
            """,
        }
    )

    def r(*attrs: str) -> Any:
        return idx.resolve_ref(("aiter.g", attrs))

    m = r("get_group", "()", "all_reduce")
    assert (m.kind, m.sig.name, [p.name for p in m.sig.params]) == (
        "func",
        "Group().all_reduce",
        ["x", "fp8"],
    )
    assert r("plain", "()", "all_reduce").sig.name == "Group().all_reduce"  # `return Group(...)`
    assert r("_G", "barrier").sig.name == "Base().barrier"  # an annotated slot; the method inherited
    assert [p.name for p in r("Group", "make").sig.params] == ["n"]  # staticmethod: nothing dropped
    via_class = r("Group", "all_reduce")
    assert [p.name for p in via_class.sig.params] == ["self", "x", "fp8"]  # `Group.all_reduce(g, x)`
    assert r("get_group", "()", "echo", "()", "view").kind == "foreign"  # returns its Tensor argument
    assert r("log", "warning").kind == "foreign"  # a logging.Logger
    assert r("table", "get").kind == "foreign"
    missing = r("get_group", "()", "gone")
    assert (missing.kind, missing.missing_what) == ("missing", "method")
    comm = r("get_group", "()", "comm", "send")
    assert (comm.kind, comm.reason) == (
        "unknown",
        "method or attribute of attribute `Group.comm` (type not evident)",
    )


def test_torch_ops_take_the_registered_schema() -> None:
    idx = index_of(
        {
            "aiter/__init__.py": "from .ops import *\n",
            "aiter/ops.py": """
            from torch import Tensor
            from .jit import compile_ops


            @compile_ops("module_x")
            def with_tensor(x: Tensor, eps: float) -> None: ...


            @compile_ops("module_x")
            def no_tensor(n: int) -> None: ...


            def plain(x: Tensor) -> Tensor: ...
            """,
        }
    )
    idx.op_names = frozenset({"with_tensor", "no_tensor", "plain"})

    def op(name: str) -> Any:
        return idx.resolve_ref(("torch.ops.aiter", (name,)))

    assert [p.name for p in op("with_tensor").sig.params] == ["x", "eps"]
    assert [p.name for p in op("no_tensor").sig.params] == ["dummy", "n"]  # torch_compile_guard's dummy
    assert op("no_tensor").sig.compiled
    plain = op("plain")
    assert (plain.kind, plain.reason) == ("unknown", "no aiter source file registers an op of this name")


def test_a_later_commit_reuses_resolutions_whose_modules_did_not_change() -> None:
    files = {
        "aiter/__init__.py": "from .a import *\nfrom .b import *\n",
        "aiter/a.py": "def f(x): ...\n",
        "aiter/b.py": "def g(y): ...\n",
    }
    cache = SummaryCache("aiter", None)
    first = FakeRepo(files)
    i1 = ApiIndex(Tree(cast(GitRepo, first), "1" * 40, first.tree), cache)
    t1 = i1.resolve_ref(("aiter", ("f",)))
    second = FakeRepo({**files, "aiter/b.py": "def g(y, z): ...\n"})  # b changed; it never says `f`
    i2 = ApiIndex(Tree(cast(GitRepo, second), "2" * 40, second.tree), cache)
    assert i2.resolve_ref(("aiter", ("f",))) is t1
    third = FakeRepo({**files, "aiter/b.py": "def g(y): ...\ndef f(x, y): ...\n"})  # now b defines `f`
    i3 = ApiIndex(Tree(cast(GitRepo, third), "3" * 40, third.tree), cache)
    t3 = i3.resolve_ref(("aiter", ("f",)))
    assert t3 is not t1 and [p.name for p in t3.sig.params] == ["x", "y"]  # the later star wins
