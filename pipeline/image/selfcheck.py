"""The image self-check: run the built image with no devices and verify it is the image we checked.

Before an image becomes a candidate, one container (no GPU, no network) runs a small stdlib
script that reads files and package metadata and imports nothing that could need a GPU:

- `aiter` and `atom` resolve (without being imported) to the trees render put in the image,
  and their installed versions are the ones render told setuptools_scm;
- every file the patch series changes has the sha256 render recorded;
- exactly one aiter is installed (no PyPI `amd-aiter` or other copy shadowing ours);
- the recipe's tools exist (`lm_eval` at the pinned version, the benchmark module); an image found
  rather than built (another model of the same pair built it) gets this part alone
  (`check_recipe_tools`): the recipe is the model's, not the image's;
- `pip check` finds no conflicts.

Then the installed ATOM and aiter Python files are copied out of that container into throwaway
git repositories (one commit each) and `pipeline check` runs on them; it must agree with the
same check of the trees render put into the context (the pre-build check). Every failed rule
is reported with its evidence; `SelfCheckError` (a BuildError, exit 7) carries them all.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import BuildError, PipelineError
from pipeline.fsutil import atomic_write_json
from pipeline.oci.engine import EngineAPI

REPORT = "selfcheck.json"
TREES_TAR = "/tmp/atom-selfcheck-trees.tar"
_FIXED_DATE = "2026-01-01T00:00:00+00:00"  # both sides of the compat comparison get the same history

# Where a module is, found without executing it (a parent package's __init__ could need a GPU).
_LOCATE = r"""
import importlib.machinery, importlib.util

def locate(name):
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name is found, never executed
    except (ImportError, ValueError):
        return None
    parts = [top]
    for p in rest.split(".") if rest else []:
        if spec is None or not spec.submodule_search_locations:
            return None
        parts.append(p)
        where = list(spec.submodule_search_locations)
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts), where)
    return spec.origin if spec is not None else None
"""

# Runs inside the image (python3, stdlib only). argv[1]: the expectations as JSON.
_PROBE = (
    _LOCATE
    + r"""
import hashlib, importlib.metadata as md, json, os, re, shutil
import subprocess, sys, tarfile
exp = json.loads(sys.argv[1])
out = {}

def norm(n):
    return re.sub(r"[-_.]+", "-", n).lower()

out["aiter_origin"] = locate("aiter")
out["atom_origin"] = locate("atom")
dists = {}
for d in md.distributions():
    name = norm(d.metadata["Name"] or "")
    where = str(d.locate_file("")) if hasattr(d, "locate_file") else ""
    dists.setdefault(name, []).append({"version": d.version, "where": where})
out["dists"] = {k: v for k, v in dists.items() if k in ("amd-aiter", "aiter", "atom", "lm-eval")}
copies = []
for entry in sys.path:
    for cand in (os.path.join(entry or ".", "aiter", "__init__.py"), os.path.join(entry or ".", "aiter.py")):
        if os.path.isfile(cand):
            copies.append(os.path.realpath(cand))
out["aiter_copies"] = sorted(set(copies))
files = {}
for rel in exp["patched_files"]:
    p = os.path.join(exp["atom_dir"], rel)
    files[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else ""
out["patched_files"] = files
out["tools"] = {
    t: shutil.which(t) or (t if os.path.isabs(t) and os.path.isfile(t) else None) for t in exp["tools"]
}
out["modules"] = {m: locate(m) for m in exp["modules"]}
pip = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
out["pip_check"] = {"code": pip.returncode, "output": (pip.stdout + pip.stderr)[-4000:]}
with tarfile.open(sys.argv[2], "w") as tf:
    for key, root in (("aiter", exp["aiter_dir"]), ("atom", exp["atom_dir"])):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    full = os.path.join(dirpath, f)
                    if os.path.isfile(full) and not os.path.islink(full):
                        tf.add(full, arcname=key + "/" + os.path.relpath(full, root))
print("SELFCHECK " + json.dumps(out, sort_keys=True))
"""
)

# The recipe's tools alone (argv[1]: {"tools": [...], "modules": [...]}): what a model needs of an
# image another model's build made (the image is the same for every model of its pair).
_TOOLS_PROBE = (
    _LOCATE
    + r"""
import json, os, shutil, sys
exp = json.loads(sys.argv[1])
out = {
    "tools": {
        t: shutil.which(t) or (t if os.path.isabs(t) and os.path.isfile(t) else None) for t in exp["tools"]
    },
    "modules": {m: locate(m) for m in exp["modules"]},
}
print("TOOLS " + json.dumps(out, sort_keys=True))
"""
)


@dataclass
class SelfCheckResult:
    failures: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


class SelfCheckError(BuildError):
    """The built image is not the image we checked: nothing is tagged."""


def _under(path: str | None, root: str) -> bool:
    return bool(path) and os.path.normpath(str(path)).startswith(root.rstrip("/") + "/")


def judge(expected: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """The failed rules, each with its evidence (pure)."""
    fails: list[str] = []
    aiter_dir, atom_dir = str(expected["aiter_dir"]), str(expected["atom_dir"])
    if not _under(facts.get("aiter_origin"), aiter_dir):
        fails.append(
            f"`aiter` resolves to {facts.get('aiter_origin')!r}, not to the checked tree in {aiter_dir}"
        )
    if not _under(facts.get("atom_origin"), atom_dir):
        fails.append(
            f"`atom` resolves to {facts.get('atom_origin')!r}, not to the checked tree in {atom_dir}"
        )
    dists = facts.get("dists") or {}
    aiters = [*dists.get("amd-aiter", []), *dists.get("aiter", [])]
    if len(aiters) != 1:
        fails.append(
            f"{len(aiters)} aiter distributions are installed ({aiters}); exactly one, ours, must be: "
            "an install step pulled another copy in"
        )
    elif aiters[0]["version"] != expected["aiter_version"]:
        fails.append(
            f"the installed amd-aiter is version {aiters[0]['version']}, not {expected['aiter_version']}"
        )
    copies = [c for c in facts.get("aiter_copies") or [] if not _under(c, aiter_dir)]
    if copies:
        fails.append(f"another aiter package is importable besides {aiter_dir}: {', '.join(copies)}")
    atoms = dists.get("atom", [])
    if len(atoms) != 1 or atoms[0]["version"] != expected["atom_version"]:
        fails.append(
            f"the installed atom distribution(s) {atoms} are not exactly version {expected['atom_version']}"
        )
    for path, sha in dict(expected["patched_files"]).items():
        got = dict(facts.get("patched_files") or {}).get(path)
        if got != sha:
            fails.append(
                f"patched file {atom_dir}/{path} has sha256 {got or 'none (missing)'}, "
                f"the series gives {sha or 'deleted'}"
            )
    fails += tool_failures(facts)
    lm = dists.get("lm-eval", [])
    if not lm or lm[0]["version"] != expected["lm_eval_version"]:
        fails.append(f"lm-eval {expected['lm_eval_version']} is not installed (found {lm})")
    pip = facts.get("pip_check") or {}
    if pip.get("code") != 0:
        fails.append(f"`pip check` reports conflicts: {str(pip.get('output', '')).strip()[-600:]}")
    return fails


def tool_failures(facts: Mapping[str, Any]) -> list[str]:
    """The recipe's executables and modules the image lacks (pure)."""
    tools = dict(facts.get("tools") or {})
    modules = dict(facts.get("modules") or {})
    fails = [f"the recipe's tool `{t}` is not in the image" for t, where in tools.items() if not where]
    fails += [f"the recipe's module `{m}` is not in the image" for m, where in modules.items() if not where]
    return fails


def check_recipe_tools(
    engine: EngineAPI,
    image: str,
    tools: list[str],
    modules: list[str],
    *,
    labels: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> list[str]:
    """Run the recipe-tools probe in `image` (no devices, no network): the failed rules.

    The model's part of the self-check, outside the inputs digest: run for every model on the image
    it found or built, since one image serves every model whose lock pins its pair.
    """
    if not tools and not modules:
        return []
    with engine.run(
        image,
        ["python3", "-c", _TOOLS_PROBE, json.dumps({"tools": tools, "modules": modules})],
        network_mode="none",
        labels=dict(labels or {}),
    ) as c:
        facts, why = _probe_output(c, "TOOLS", timeout)
    return [f"the recipe-tools probe {why}"] if facts is None else tool_failures(facts)


def _probe_output(c: Any, marker: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """A probe container's last `MARKER {json}` line, once it exited 0; else None and why not."""
    code = c.wait(timeout=timeout)
    logs = c.logs()
    lines = [ln for ln in logs.splitlines() if ln.startswith(marker + " ")]
    if code != 0 or not lines:
        return None, f"exited {code} in the image: " + logs.strip()[-1500:]
    facts: dict[str, Any] = json.loads(lines[-1][len(marker) + 1 :])
    return facts, ""


def _check_signature(report: Any) -> dict[str, Any]:
    return {
        "calls_checked": report.calls_checked,
        "calls_unchecked": report.calls_unchecked,
        "findings": sorted((f.path, f.line, f.severity, f.kind) for f in report.findings),
    }


def _commit_tree(src: Path, repo_dir: Path) -> tuple[Any, str]:
    from pipeline.gitw import GitRepo, git_error, run_git

    shutil.copytree(src, repo_dir, symlinks=True)
    init = run_git(["init", "-q", str(repo_dir)])
    if not init.ok:
        raise git_error(init, str(repo_dir))
    repo = GitRepo(repo_dir)
    env = {
        "GIT_AUTHOR_DATE": _FIXED_DATE,
        "GIT_COMMITTER_DATE": _FIXED_DATE,
        "GIT_AUTHOR_NAME": "selfcheck",
        "GIT_AUTHOR_EMAIL": "selfcheck@example.invalid",
        "GIT_COMMITTER_NAME": "selfcheck",
        "GIT_COMMITTER_EMAIL": "selfcheck@example.invalid",
    }
    repo.git("add", "-A", env=env)
    repo.git("commit", "-q", "--allow-empty", "-m", "tree", env=env)
    return repo, repo.git("rev-parse", "HEAD")


def compat_signature(trees: Path, work: Path) -> dict[str, Any]:
    """`pipeline check` of trees/atom against trees/aiter, each one commit in a throwaway repo."""
    from pipeline.compat import run_check

    atom, atom_sha = _commit_tree(trees / "atom", work / "atom")
    aiter, aiter_sha = _commit_tree(trees / "aiter", work / "aiter")
    return _check_signature(run_check(atom, atom_sha, aiter, aiter_sha, cache_dir=work / "cache"))


def _python_only(src: Path, dest: Path) -> None:
    for path in sorted(src.rglob("*.py")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def run_selfcheck(
    engine: EngineAPI,
    image: str,
    expected: Mapping[str, Any],
    context: Path,
    *,
    run_dir: Path | None,
    labels: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> SelfCheckResult:
    """Run the probe in `image` (no devices, no network), judge it, compare the compat checks."""
    result = SelfCheckResult()
    with tempfile.TemporaryDirectory(prefix="atom-selfcheck-") as tmp:
        work = Path(tmp)
        with engine.run(
            image,
            ["python3", "-c", _PROBE, json.dumps(dict(expected)), TREES_TAR],
            network_mode="none",
            labels=dict(labels or {}),
        ) as c:
            facts, why = _probe_output(c, "SELFCHECK", timeout)
            if facts is None:
                result.failures.append(f"the self-check probe {why}")
                _write(run_dir, result)
                return result
            result.facts = facts
            result.failures += judge(expected, facts)
            try:
                outer = io.BytesIO(engine.archive(c.id, TREES_TAR))
            except PipelineError as e:  # the engine's refusal is evidence, not a traceback
                result.failures.append(f"could not copy the installed trees out of the image: {e.message}")
                _write(run_dir, result)
                return result
        with tarfile.open(fileobj=outer) as tf:
            member = tf.extractfile(os.path.basename(TREES_TAR))
            if member is None:
                raise BuildError("the self-check's tree archive is empty.")
            with tarfile.open(fileobj=io.BytesIO(member.read())) as inner:
                inner.extractall(work / "installed", filter="data")
        for side in ("atom", "aiter"):
            _python_only(context / side, work / "context" / side)
            # the installed copies of the checked files (what the build added is not checked code)
            for path in sorted((work / "context" / side).rglob("*.py")):
                rel = path.relative_to(work / "context")
                src = work / "installed" / rel
                if src.is_file():
                    (work / "image" / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, work / "image" / rel)
            (work / "image" / side).mkdir(parents=True, exist_ok=True)
        try:
            installed = compat_signature(work / "image", work / "check-image")
            checked = compat_signature(work / "context", work / "check-context")
        except PipelineError as e:
            result.failures.append(f"`pipeline check` could not run on the installed trees: {e.message}")
            _write(run_dir, result)
            return result
        result.facts["compat"] = {"installed": installed, "pre_build": checked}
        if installed != checked:
            result.failures.append(
                "`pipeline check` of the installed aiter against the installed ATOM differs from the "
                f"pre-build check: installed {_brief(installed)}, pre-build {_brief(checked)}"
            )
        changed = _changed_sources(work / "context", work / "image")
        if changed:
            result.failures.append(
                f"{len(changed)} checked Python file(s) differ in the image: " + ", ".join(changed[:8])
            )
    _write(run_dir, result)
    return result


def _changed_sources(context: Path, image: Path) -> list[str]:
    out = []
    for path in sorted(context.rglob("*.py")):
        rel = path.relative_to(context)
        other = image / rel
        if not other.is_file() or other.read_bytes() != path.read_bytes():
            out.append(rel.as_posix())
    return out


def _brief(sig: Mapping[str, Any]) -> str:
    return (
        f"{sig['calls_checked']} calls checked, {sig['calls_unchecked']} unchecked, "
        f"{len(sig['findings'])} finding(s)"
    )


def _write(run_dir: Path | None, result: SelfCheckResult) -> None:
    if run_dir is not None:
        atomic_write_json(
            run_dir / REPORT, {"ok": result.ok, "failures": result.failures, "facts": result.facts}
        )


def failure(result: SelfCheckResult, image_id: str, run_dir: Path | None) -> SelfCheckError:
    where = f" The full report is {run_dir / REPORT}." if run_dir is not None else ""
    return SelfCheckError(
        f"the image self-check failed for {image_id[:19]}: it is not the image that was checked:\n"
        + "\n".join(f"  - {f}" for f in result.failures),
        hint=f"Nothing was tagged and the image was removed.{where}",
        evidence=json.dumps(result.facts, indent=2, sort_keys=True)[-20000:],
    )
