"""The calls the scanner has to reach (issue 12 §2), on fixture repositories built by code."""

from __future__ import annotations

import pytest

from pipeline.compat import CheckReport, Finding, run_check
from pipeline.gitw import GitRepo
from tests.fixtures.compat_reach import ReachRepos, build_reach_repos


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    return build_reach_repos(tmp_path_factory.mktemp("reach"))


@pytest.fixture(scope="module")
def at_r1(fx: ReachRepos) -> CheckReport:
    return run_check(GitRepo(fx.atom), fx.t["S1"], GitRepo(fx.aiter), fx.a["R1"])


@pytest.fixture(scope="module")
def at_r2(fx: ReachRepos) -> CheckReport:
    return run_check(GitRepo(fx.atom), fx.t["S1"], GitRepo(fx.aiter), fx.a["R2"])


def line(fx: ReachRepos, path: str, needle: str) -> int:
    text = GitRepo(fx.atom).read_blob(fx.t["S1"], path)
    assert text is not None
    (hit,) = [i for i, t in enumerate(text.decode().splitlines(), 1) if needle in t]
    return hit


def finding(r: CheckReport, fx: ReachRepos, path: str, needle: str) -> Finding:
    n = line(fx, path, needle)
    got = [f for f in r.findings if f.path == path and f.line == n]
    assert len(got) == 1, [(f.path, f.line, f.kind, f.message) for f in r.findings]
    return got[0]


def unchecked(r: CheckReport, fx: ReachRepos, path: str, needle: str) -> list[str]:
    n = line(fx, path, needle)
    return [u.reason for u in r.unchecked if u.path == path and u.line == n]


def test_written_against_r1_only_the_name_nothing_defines_is_an_error(
    at_r1: CheckReport, fx: ReachRepos
) -> None:
    (err,) = at_r1.errors
    assert (err.kind, err.path) == ("missing-function", "atom/ext.py")
    assert err.line == line(fx, "atom/ext.py", "ext_never_bound")
    assert at_r1.warnings == []


def test_methods_of_aiter_objects_are_checked_without_self(at_r2: CheckReport, fx: ReachRepos) -> None:
    # A chain from an annotated factory: the keyword renamed in R2.
    f = finding(at_r2, fx, "atom/groups.py", "all_reduce(y, ca_fp8_quant=False)")
    assert (f.severity, f.kind) == ("error", "unexpected-keyword")
    assert f.function == "aiter.dist.parallel_state.get_tp_group().all_reduce"
    assert "ca_fp8_quant" in f.message
    # A variable from an unannotated factory (`return GroupCoordinator(...)`): the method removed.
    f = finding(at_r2, fx, "atom/groups.py", "group.all_gather(x, 0)")
    assert (f.severity, f.kind) == ("error", "missing-function")
    # A module-level singleton: `otype` became keyword-only, the 4th positional has nowhere to go.
    f = finding(at_r2, fx, "atom/groups.py", 'tgemm.mm(x, w, None, "bf16")')
    assert (f.severity, f.kind) == ("error", "too-many-positional")
    assert f.function == "aiter.tuned_gemm.tgemm.mm"


def test_objects_calls_are_counted_checked_and_foreign_values_are_not_aiter_calls(
    at_r1: CheckReport, fx: ReachRepos
) -> None:
    assert unchecked(at_r1, fx, "atom/groups.py", "self.tp.broadcast(x, 0)") == []
    assert unchecked(at_r1, fx, "atom/groups.py", "y.view(-1)") == []  # broadcast returns its Tensor
    assert unchecked(at_r1, fx, "atom/groups.py", "GroupCoordinator.make(4)") == []  # a staticmethod
    assert unchecked(at_r1, fx, "atom/groups.py", "self.rope(positions, x, w)") == []  # nn.Module: forward
    # An attribute whose type is not evident: listed once, at the first link of the chain.
    reasons = unchecked(at_r1, fx, "atom/groups.py", "device_communicator.send(1).wait()")
    assert reasons == [
        "method or attribute of attribute `GroupCoordinator.device_communicator` (type not evident)"
    ]


def test_a_torch_module_call_binds_to_forward(
    fx: ReachRepos, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.fixtures.gitfixture import commit_all, write_files

    write_files(
        fx.atom,
        {
            "atom/rope_bad.py": "from aiter.rotary_embedding import get_rope\n\n\n"
            "def f(p, q, k, v):\n    return get_rope(64)(p, q, k, v)\n"
        },
    )
    sha = commit_all(fx.atom, "a torch module called with one argument too many", "2026-01-16T00:00:00+00:00")
    r = run_check(GitRepo(fx.atom), sha, GitRepo(fx.aiter), fx.a["R1"])
    (f,) = [f for f in r.findings if f.path == "atom/rope_bad.py"]
    assert f.kind == "too-many-positional" and "RotaryEmbedding().forward" in f.message


def test_star_arguments_are_checked_as_far_as_they_go(
    at_r1: CheckReport, at_r2: CheckReport, fx: ReachRepos
) -> None:
    path = "atom/stars.py"
    for needle in ('**{"mode": "b"}', "**params)", '*rest, mode="b"'):
        f = finding(at_r2, fx, path, needle)
        assert (f.severity, f.kind) == ("error", "unexpected-keyword"), needle
        assert "mode" in f.message
    # Only *args/**kwargs: nothing to check, listed as such.
    assert unchecked(at_r2, fx, path, "fused_op(*rest, **extra)") == [
        "arguments passed only through *args/**kwargs"
    ]
    # Explicit arguments beside an unknown **kwargs, and a dict changed after its literal: checked
    # on what is explicit only, and clean.
    for needle in ("w, **extra)", "w, **opts)"):
        n = line(fx, path, needle)
        assert not [f for f in at_r2.findings if f.line == n and f.path == path], needle
        assert unchecked(at_r2, fx, path, needle) == []
    assert not [f for f in at_r1.findings if f.path == path]


def test_torch_ops_aiter_bind_to_the_registered_schema(
    at_r1: CheckReport, at_r2: CheckReport, fx: ReachRepos
) -> None:
    path = "atom/ops.py"
    # compile_ops with a Tensor first: the schema is the signature; R2 drops `eps`.
    f = finding(at_r2, fx, path, "rms_norm(out, x, w, 1e-6)")
    assert (f.severity, f.kind, f.function) == ("error", "too-many-positional", "torch.ops.aiter.rms_norm")
    # A first parameter that is not a Tensor: the op takes a leading dummy Tensor (clean in both).
    assert not [g for g in at_r1.findings + at_r2.findings if g.line == line(fx, path, "norm_cfg(")]
    # direct_register_custom_op in a module `import aiter` does not load: R2 adds a required `seed`.
    f = finding(at_r2, fx, path, "top_p.default(")
    assert (f.severity, f.kind) == ("error", "missing-argument")
    # An op ATOM registers in the `aiter` namespace itself is not a call of aiter: not counted at all.
    assert unchecked(at_r1, fx, path, "torch.ops.aiter.my_op(x)") == []
    assert not [g for g in at_r1.findings if g.line == line(fx, path, "torch.ops.aiter.my_op(x)")]
    assert unchecked(at_r1, fx, path, "torch.ops.aiter.nowhere(x)") == [
        "no aiter source file registers an op of this name"
    ]


def test_names_of_the_compiled_extension_are_decided_by_its_bindings(
    at_r1: CheckReport, at_r2: CheckReport, fx: ReachRepos
) -> None:
    path = "atom/ext.py"
    (reason,) = unchecked(at_r1, fx, path, "aiter.ext_fn(x)")
    assert (
        reason == "defined by aiter's compiled extension `aiter_` (bound in csrc/ C++, no Python signature)"
    )
    f = finding(at_r2, fx, path, "aiter.ext_fn(x)")  # dropped from the C++ bindings in R2
    assert (f.severity, f.kind) == ("error", "missing-function")


def test_the_counts_are_the_sum_of_what_is_listed(at_r1: CheckReport, at_r2: CheckReport) -> None:
    for r in (at_r1, at_r2):
        assert r.calls_unchecked == len(r.unchecked)
    # `ext_fn`: unchecked while the extension binds it, a missing function once it does not.
    assert at_r2.calls_checked == at_r1.calls_checked + 1
