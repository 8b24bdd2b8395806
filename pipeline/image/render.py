"""Render the Dockerfile and the build context from the jinja2 templates.

Two layers:

- `plan_render(...)` and `render_dockerfile(...)` are pure: from the lock, the
  tree ids, the recipe hash and the settings they compute every value the
  template receives, the labels and the inputs digest, and render the text.
  No git, no docker, no clock: the unit tier tests them with golden files.
- `render_context(...)` does the I/O: checks the trees in the mirrors, exports
  them with `git archive` into the context (ATOM patched, aiter, aiter's
  submodules), writes the Dockerfile, the lock, `.dockerignore` and
  `render.json` (the manifest `build_image` reads), all into a temp directory
  that replaces `out_dir` only when complete.

The template environment and its quoting filters are pipeline.image.dockerfile; the context's
layout, manifest and shared directory are pipeline.image.context.
Determinism: no wall-clock time anywhere; `created` is SOURCE_DATE_EPOCH or
the newer of the two locked commit dates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import __version__, labels, toolpins
from pipeline.config import Settings
from pipeline.errors import RenderError, SourceError
from pipeline.fsutil import atomic_write_json, atomic_write_text, make_temp_dir, sha256_bytes, sha256_file
from pipeline.image.context import (
    DOCKERFILE,
    DOCKERFILE_CLASSIC,
    FILES_INDEX,
    MANIFEST,
    PAIR_NAME,
    PARITY,
    WHEELS,
    RenderedContext,
    candidate_tag,
    check_model,
    locked_shared_context,
    shared_context_dir,
)
from pipeline.image.dockerfile import (
    NOT_AN_INPUT,
    URL_CHARS,
    VERSION_RE,
    dockerfile_values,
    f_json,
    render_dockerfile,
    template_sources,
)
from pipeline.lock import Lock
from pipeline.validate import submodule_url_problem

if TYPE_CHECKING:
    from pipeline.gitw import GitRepo

DIGEST_SCHEMA = 3  # 3: the pair digest, no model or recipe
WHEELS_IN_IMAGE = "/tmp/atom-wheels"

# Where the trees live in the image (as in the upstream ATOM release image).
AITER_DIR = "/app/aiter-test"
ATOM_DIR = "/app/ATOM"
PIPELINE_DIR = "/app/atom-image-pipeline"

# Label keys this module adds beyond pipeline.labels (informational only).
ATOM_TREE = f"{labels.OURS}.atom.tree"  # tree id of the patched ATOM commit (content, not history)
AITER_SUBMODULES = f"{labels.OURS}.aiter.submodules"  # JSON list of {path, sha}
LM_EVAL = f"{labels.OURS}.lm-eval.version"  # the lm-eval baked into the image
SETUPTOOLS_SCM = f"{labels.OURS}.setuptools-scm.version"

# The image carries the pair it is built from (Lock.pair()), not a model's lock.
PAIR_HEADER = (
    "# The pinned inputs this image is built from (atom-image-pipeline: Lock.pair()); its sha256 is the\n"
    "# image's org.atom-image-pipeline.pair.digest label. Every model whose lock pins them shares it.\n"
)

# Only what is not part of the trees: the image must hold exactly the exported trees.
DOCKERIGNORE = f"# written by atom-image-pipeline render\n**/.git\n/{MANIFEST}\n/{FILES_INDEX}\n/{PARITY}\n"


# --------------------------------------------------------------------------- quoting


_SHA = re.compile(r"^[0-9a-f]{40}$")
_URL = re.compile(rf"^(?:(?:https?|ssh|git|file)://{URL_CHARS}|[\w.-]+@[\w.-]+:{URL_CHARS})$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_NETWORKS = ("host", "none", "default", "bridge")


# --------------------------------------------------------------------------- pure part


@dataclass(frozen=True)
class SubmoduleSpec:
    path: str  # relative to the aiter tree
    url: str
    sha: str
    source: str  # "mirror" | "in-build"


@dataclass(frozen=True)
class RenderPlan:
    values: dict[str, Any]  # everything the template receives (inputs_digest included)
    labels: dict[str, str]
    inputs_digest: str
    inputs: dict[str, Any]  # what the digest is computed over (for render.json)
    image_ref: str


def created_time(lock: Lock, source_date_epoch: int | None) -> str:
    if source_date_epoch is not None:
        if source_date_epoch < 0:
            raise RenderError(f"SOURCE_DATE_EPOCH={source_date_epoch} is negative.")
        return datetime.fromtimestamp(source_date_epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    dates = []
    for pin in (lock.atom, lock.aiter):
        try:
            d = datetime.fromisoformat(pin.date.replace("Z", "+00:00"))
        except ValueError:
            raise RenderError(f"lock date {pin.date!r} is not an ISO 8601 time.") from None
        dates.append(d if d.tzinfo else d.replace(tzinfo=UTC))
    return max(dates).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pep440_from_describe(describe: str | None, sha: str, extra: str = "") -> str:
    """`v0.1.16-86-g08f04b889a` -> `0.1.16+86.g08f04b889a` (for setuptools_scm, which needs .git)."""
    local = [f"g{sha[:10]}"]
    base = "0.0.0"
    if describe:
        m = re.match(r"^v?(.+)-(\d+)-g[0-9a-f]+$", describe)
        if m and VERSION_RE.match(m.group(1)) and "+" not in m.group(1):
            base = m.group(1)
            if m.group(2) != "0":
                local.insert(0, m.group(2))
    if extra:
        local.append(extra)
    version = f"{base}+{'.'.join(local)}"
    return version if VERSION_RE.match(version) else f"0.0.0+g{sha[:10]}"


def check_repository(repository: str) -> str:
    from pipeline.errors import UsageError
    from pipeline.oci.ref import parse_image_ref

    try:
        ref = parse_image_ref(repository)
    except UsageError:
        ref = None
    if ref is None or ref.tag or ref.digest:
        raise RenderError(
            f"image repository {repository!r} is not a valid Docker repository name.",
            hint="Set [image] repository to e.g. registry.example.com/rocm/atom-dev (lower case).",
        )
    return repository


def base_image_note(lock: Lock, settings: Settings) -> str | None:
    """The lock is final after patch: render takes its base image, and says so when a configured
    one (file, environment) names another."""
    configured = settings.image.base_image
    if settings.origins.get("base_image", "default") == "default":
        return None
    if configured.split("@", 1)[0] == lock.base_image.ref.split("@", 1)[0]:
        return None
    return (
        f"rendering the lock's base image {lock.base_image.pinned}; [image] base_image (from "
        f"{settings.origins['base_image']}) names {configured}: `pipeline pin --base-image` re-pins it"
    )


def plan_render(
    *,
    lock: Lock,
    atom_tree: str,
    aiter_tree: str,
    submodules: tuple[SubmoduleSpec, ...],
    settings: Settings,
    template_hashes: Mapping[str, str],
    source_date_epoch: int | None = None,
    atom_version: str | None = None,
    aiter_version: str | None = None,
    wheel_hashes: Mapping[str, str] | None = None,
    aiter_requirements: bool = False,
) -> RenderPlan:
    """Every value, label and the inputs digest. Pure: same inputs, same plan.

    Nothing of the model or its recipe: the image is made of the lock's pair (`Lock.pair()`), the
    trees, the settings, the templates and the wheels, so two models whose locks pin the same pair
    share one image. Which model and recipe it served is the smoke verdict's to say.
    """
    img = settings.image
    check_model(lock.model)
    repository = check_repository(img.repository)
    if not lock.base_image.digest:
        raise RenderError(
            f"the lock pins base image {lock.base_image.ref!r} without a digest.",
            hint="Run `pipeline pin` where the registry answers, or give the digest yourself with "
            "`pipeline pin --base-image NAME:TAG@sha256:DIGEST`.",
        )
    for what, sha in (("ATOM tree", atom_tree), ("aiter tree", aiter_tree)):
        if not _SHA.match(sha):
            raise RenderError(f"{what} id {sha!r} is not a full SHA.")
    m = re.search(r"\bGPU_ARCHS=(['\"]?)([^\s'\"]+)\1", img.aiter_build_cmd)
    if m and m.group(2) != img.gpu_archs:
        raise RenderError(
            f"[image] aiter_build_cmd builds for GPU_ARCHS={m.group(2)} but [image] gpu_archs is "
            f"{img.gpu_archs!r}.",
            hint="Make the two agree (the kernels must be built for the GPUs the image runs on).",
        )
    check_build_settings(settings)
    created = created_time(lock, source_date_epoch)
    patches = [{"name": p.name, "sha256": p.sha256} for p in lock.applied_patches]
    patchset = hashlib.sha256(f_json(patches).encode()).hexdigest()[:8] if patches else ""
    atom_version = atom_version or pep440_from_describe(None, lock.atom.sha)
    aiter_version = aiter_version or pep440_from_describe(None, lock.aiter.sha)
    for v in (atom_version, aiter_version):
        if not VERSION_RE.match(v):
            raise RenderError(f"package version {v!r} is not a PEP 440 version.")
    version = f"atom-{lock.atom.sha[:10]}_aiter-{lock.aiter.sha[:10]}"
    if patchset:
        version += f"_p-{patchset}"

    oci_labels: dict[str, str] = {
        labels.OCI_SOURCE: lock.atom.url,
        labels.OCI_REVISION: lock.atom.sha,
        labels.OCI_CREATED: created,
        labels.OCI_VERSION: version,
        labels.OCI_TITLE: "ATOM inference image",
        labels.OCI_BASE_NAME: lock.base_image.ref.split("@", 1)[0],
        labels.OCI_BASE_DIGEST: lock.base_image.digest,
        labels.ATOM_SHA: lock.atom.sha,
        labels.ATOM_URL: lock.atom.url,
        ATOM_TREE: atom_tree,
        labels.AITER_SHA: lock.aiter.sha,
        labels.AITER_URL: lock.aiter.url,
        AITER_SUBMODULES: f_json([{"path": s.path, "sha": s.sha} for s in submodules]),
        labels.PATCHES: f_json(patches),
        labels.PAIR_DIGEST: lock.pair_digest(),
        labels.TOOL_VERSION: __version__,
        LM_EVAL: toolpins.LM_EVAL_VERSION,
        SETUPTOOLS_SCM: toolpins.SETUPTOOLS_SCM_VERSION,
    }
    values: dict[str, Any] = {
        "tool_version": __version__,
        "base_image": lock.base_image.pinned,
        "gpu_archs": img.gpu_archs,
        "aiter_build_cmd": img.aiter_build_cmd,
        "atom_install_cmd": img.atom_install_cmd,
        "aiter_dir": AITER_DIR,
        "atom_dir": ATOM_DIR,
        "pipeline_dir": PIPELINE_DIR,
        "pair_name": PAIR_NAME,
        "aiter_sha": lock.aiter.sha,
        "atom_sha": lock.atom.sha,
        "aiter_version": aiter_version,
        "atom_version": atom_version,
        "patches": patches,
        "submodules": [
            {"path": s.path, "dest": f"{AITER_DIR}/{s.path}", "url": s.url, "sha": s.sha, "source": s.source}
            for s in submodules
        ],
        "in_build_submodules": [
            {"path": s.path, "dest": f"{AITER_DIR}/{s.path}", "url": s.url, "sha": s.sha}
            for s in submodules
            if s.source == "in-build"
        ],
        "labels": oci_labels,
        "lm_eval_requirement": toolpins.LM_EVAL_REQUIREMENT,
        "setuptools_scm_requirement": toolpins.SETUPTOOLS_SCM_REQUIREMENT,
        "wheels_in_image": WHEELS_IN_IMAGE,
        "python_version": img.python_version,  # the base image's; the wheelhouse is for it
        "aiter_requirements": aiter_requirements,
        "wheelhouse": bool(wheel_hashes) if wheel_hashes is not None else True,
        "max_jobs": img.max_jobs,
        "prebuild_kernels": str(img.prebuild_kernels),
        "offline_build": img.offline_build,
        "require_git": img.require_git,
        "build_secrets": list(img.build_secrets),
    }
    inputs: dict[str, Any] = {
        "schema": DIGEST_SCHEMA,
        "tool_version": __version__,
        "pair": lock.pair_digest(),  # the pinned facts; not the model, nor the refs they were asked by
        "atom_tree": atom_tree,
        "aiter_tree": aiter_tree,
        "templates": dict(sorted(template_hashes.items())),
        "wheels": dict(sorted((wheel_hashes or {}).items())),
        "values": values,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    all_labels = {**oci_labels, labels.INPUTS_DIGEST: digest}
    values = {**values, "labels": all_labels, "inputs_digest": digest}
    return RenderPlan(
        values=values,
        labels=all_labels,
        inputs_digest=digest,
        inputs=inputs,
        image_ref=f"{repository}:{candidate_tag(digest)}",
    )


AITER_STAGE = "aiter"  # the Dockerfile's `FROM base AS aiter`
_ATOM_STAGE = re.compile(r"^FROM aiter AS atom$", re.MULTILINE)
_FIRST_FROM = re.compile(r"^FROM ", re.MULTILINE)


def aiter_stage_key(
    dockerfile: str, aiter_tree: str, submodules: tuple[SubmoduleSpec, ...], wheel_hashes: Mapping[str, str]
) -> str:
    """sha256 over what the stages up to aiter's are built from, and nothing of ATOM or the model.

    Their Dockerfile instructions (base digest, archs, build arguments, aiter's build command;
    comments, which name the model and the inputs digest, left out), the aiter tree and its
    submodules' commits they COPY, and the wheelhouse they install from. Every model and ATOM
    commit with the same aiter pin and settings has the same key, so the registry cache under it
    holds one compile of aiter for all of them.
    """
    start, end = _FIRST_FROM.search(dockerfile), _ATOM_STAGE.search(dockerfile)
    if start is None or end is None:
        raise RenderError("internal: the rendered Dockerfile has no `FROM aiter AS atom` stage.")
    # comments are no part of a build step (and the next stage's banner names ATOM)
    text = dockerfile[start.start() : end.start()]
    steps = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    inputs = {
        "stages": steps,
        "aiter_tree": aiter_tree,
        "submodules": sorted([s.path, s.sha] for s in submodules),
        "wheels": dict(sorted(wheel_hashes.items())),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_build_settings(settings: Settings) -> None:
    """The [image] build settings that reach the Dockerfile or the build command line."""
    img = settings.image
    if img.max_jobs and not img.max_jobs.isdigit():
        raise RenderError(
            f"[image] max_jobs = {img.max_jobs!r} is not a number.",
            hint='Set it to a positive integer, or to "" to let aiter choose from cores and memory.',
        )
    if img.prebuild_kernels < 0:
        raise RenderError(f"[image] prebuild_kernels = {img.prebuild_kernels} is negative.")
    if img.network not in _NETWORKS:
        raise RenderError(
            f"[image] network = {img.network!r} is not a build network mode.",
            hint="Use one of: " + ", ".join(_NETWORKS) + " (upstream builds with host).",
        )
    if not VERSION_RE.match(img.python_version):
        raise RenderError(f"[image] python_version = {img.python_version!r} is not a version like 3.10.")
    for name in img.build_secrets:
        if not _ENV_NAME.match(name):
            raise RenderError(
                f"[image] build_secrets names {name!r}, which is not an environment variable name.",
                hint="List the NAMES of environment variables (e.g. GIT_TOKEN), never their values.",
            )


# --------------------------------------------------------------------------- I/O part


def _resolve(repo: GitRepo, sha: str, what: str) -> str:
    if repo.rev_parse(sha) is None:
        raise RenderError(
            f"{what} commit {sha} is not in the mirror {repo.path}.",
            hint="Run `pipeline pin` (it fetches the mirrors) or check the repository paths.",
        )
    return repo.git("rev-parse", f"{sha}^{{tree}}")


def _describe(repo: GitRepo, sha: str) -> str | None:
    try:
        return repo.git("describe", "--tags", "--long", "--match", "v[0-9]*", sha) or None
    except SourceError:
        return None


def _archive_attributes(repo: GitRepo, rev: str) -> list[str]:
    """`.gitattributes` lines that would make `git archive` differ from the tree."""
    found = []
    for path, sha in repo.blob_shas(rev, suffix=".gitattributes").items():
        for _, data in repo.read_blobs([sha]):
            for line in data.decode("utf-8", "replace").splitlines():
                if "export-ignore" in line or "export-subst" in line:
                    found.append(f"{path}: {line.strip()}")
    return found


# One exported file: (git mode, blob sha). The index of a context maps its paths to these, so the
# next render can hard-link what did not change instead of writing it again.
FileIndex = dict[str, tuple[str, str]]


def _tree_entries(repo: GitRepo, rev: str) -> list[tuple[str, str, str]]:
    """(mode, blob sha, path) of every blob and symlink at `rev` (gitlinks are not files)."""
    out = []
    for rec in repo.git("ls-tree", "-r", "-z", "--full-tree", rev).split("\0"):
        if not rec:
            continue
        meta, _, path = rec.partition("\t")
        mode, kind, sha = meta.split()
        if kind == "blob":
            out.append((mode, sha, path))
    return out


def _safe_link_target(dest: Path, path: str, target: str) -> bool:
    if target.startswith("/"):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return not (resolved == ".." or resolved.startswith("../"))


def export_tree(
    repo: GitRepo,
    rev: str,
    dest: Path,
    *,
    prefix: str = "",
    reuse: Mapping[str, tuple[str, str]] | None = None,
    reuse_root: Path | None = None,
    index: FileIndex | None = None,
) -> int:
    """The tree at `rev` written into `dest` exactly (file modes, symlinks); the number of files.

    Files whose (mode, blob) equal the entry for `prefix + path` in `reuse` are hard-linked from
    `reuse_root` (a previous context: same bytes, same mtime, so BuildKit does not send them
    again); the others are written from the object store. `index` receives every file written.
    The image must hold exactly the tree that was checked, so trees whose attributes make
    `git archive` differ from the tree are refused, as are links pointing outside it.
    """
    attrs = _archive_attributes(repo, rev)
    if attrs:
        raise RenderError(
            f"{repo.path} at {rev[:10]} has export attributes that make `git archive` differ from the "
            "tree: " + "; ".join(attrs[:5]) + ".",
            hint="The image must hold the exact tree; remove those attributes with a patch.",
        )
    dest.mkdir(parents=True, exist_ok=True)
    entries = _tree_entries(repo, rev)
    fresh: dict[str, list[tuple[str, str]]] = {}
    for mode, sha, path in entries:
        key = prefix + path
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        old = reuse.get(key) if reuse else None
        if old == (mode, sha) and reuse_root is not None and mode != "120000":
            try:
                os.link(reuse_root / key, target)
                if index is not None:
                    index[key] = (mode, sha)
                continue
            except OSError:
                pass  # gone, or another file system: write it
        fresh.setdefault(sha, []).append((mode, path))
    for sha, data in repo.read_blobs(list(fresh)):
        for mode, path in fresh[sha]:
            target = dest / path
            if mode == "120000":
                link = data.decode("utf-8", "surrogateescape")
                if not _safe_link_target(dest, path, link):
                    raise RenderError(
                        f"{repo.path} at {rev[:10]}: {path} links to {link!r}, outside the tree "
                        "(a link pointing outside the tree is not exported).",
                    )
                os.symlink(link, target)
            else:
                target.write_bytes(data)
                os.chmod(target, 0o755 if mode == "100755" else 0o644)
            if index is not None:
                index[prefix + path] = (mode, sha)
    got = sum(1 for _, _, path in entries if (dest / path).is_symlink() or (dest / path).is_file())
    if got != len(entries):
        raise RenderError(
            f"exporting {rev} from {repo.path} gave {got} files, the tree has {len(entries)}.",
            hint="The image must hold the exact tree.",
        )
    return got


def read_file_index(context: Path) -> FileIndex:
    """The file index of a previous context, or {} (then nothing is reused)."""
    try:
        data = json.loads((context / FILES_INDEX).read_text(encoding="utf-8"))
        return {str(k): (str(v[0]), str(v[1])) for k, v in dict(data).items()}
    except (OSError, ValueError, TypeError, IndexError, KeyError):
        return {}


def wheel_pythons(name: str) -> set[str] | None:
    """The CPython versions ("3.11") a wheel file is built for; None when any python 3 takes it
    (a pure `py3` wheel, or the stable ABI `abi3`)."""
    parts = name[: -len(".whl")].split("-")
    if len(parts) < 5:
        return None
    py_tags, abi = parts[-3].split("."), parts[-2]
    if abi == "abi3" or not all(re.fullmatch(r"cp3\d+", t) for t in py_tags):
        return None
    return {f"3.{t[3:]}" for t in py_tags}


def check_wheelhouse_python(wheels_dir: Path, names: list[str], python_version: str) -> None:
    """Refuse a wheelhouse downloaded for another python than the image's ([image] python_version)."""
    foreign = [(n, v) for n in names if (v := wheel_pythons(n)) is not None and python_version not in v]
    if not foreign:
        return
    theirs = sorted({x for _, v in foreign for x in v})
    raise RenderError(
        f"the wheelhouse {wheels_dir} holds wheels for python {', '.join(theirs)} (e.g. {foreign[0][0]}), "
        f"but [image] python_version is {python_version}, the base image's python: pip in the image "
        "could not install them.",
        hint=f"Run `scripts/setup.sh image-wheelhouse`: it downloads the wheelhouse for [image] "
        f"python_version ({python_version}; it needs python{python_version} on this host) into [paths] "
        "wheels_dir, both read from this configuration. Or set [image] python_version to the base "
        "image's python.",
    )


def link_wheelhouse(wheels_dir: Path, dest: Path, *, required: bool, python_version: str) -> dict[str, str]:
    """Hard-link (or copy) the wheelhouse into the context; {file name: sha256}.

    Without the pinned lm-eval, setuptools_scm and pip the image installs those pins from the
    package index instead (the build needs the network, as upstream's does); `required` (an
    offline build) refuses that. Wheels built for another python than `python_version` are refused.
    """
    names = sorted(p.name for p in wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    check_wheelhouse_python(wheels_dir, names, python_version)
    want = f"lm_eval-{toolpins.LM_EVAL_VERSION}-"
    scm = f"setuptools_scm-{toolpins.SETUPTOOLS_SCM_VERSION}-"
    missing = [w.rstrip("-") for w in (want, scm, "pip-") if not any(n.startswith(w) for n in names)]
    dest.mkdir(parents=True, exist_ok=True)
    if missing:
        if required:
            raise RenderError(
                f"the wheelhouse {wheels_dir} lacks {', '.join(missing)}: an offline build ([image] "
                "offline_build) installs lm-eval, setuptools_scm and pip from it only.",
                hint=f"Run `scripts/setup.sh image-wheelhouse` (the wheelhouse for [image] python_version, "
                f"python {python_version}, into [paths] wheels_dir, both read from this configuration), or "
                f"point [paths] wheels_dir (PIPELINE_WHEELS_DIR) at a wheelhouse for python "
                f"{python_version}.",
            )
        return {}
    hashes = {}
    for name in names:
        src = wheels_dir / name
        try:
            os.link(src, dest / name)
        except OSError:
            shutil.copy2(src, dest / name)
        hashes[name] = sha256_file(dest / name)
    return hashes


def sweep_stale_stages(out_dir: Path) -> None:
    """Remove what a killed render left beside `out_dir` (`.<name>.<pid>.*`, its pid gone)."""
    prefix = f".{out_dir.name}."
    try:
        siblings = list(out_dir.parent.iterdir())
    except OSError:
        return
    for path in siblings:
        pid = path.name[len(prefix) :].split(".", 1)[0]
        if not path.name.startswith(prefix) or not pid.isdigit() or _alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


def mirror_shared_context(out_dir: Path, settings: Settings, model: str) -> None:
    """Hard-link the rendered context into the model's shared directory in the cache (the next
    render, in any directory, reuses it; BuildKit builds from it).

    When the cache has no room (or is read-only), the shared directory is removed, not left half
    mirrored, and the error names it (an OSError of a copy may name its source in the run directory).
    """
    from pipeline.errors import disk_error
    from pipeline.oci.buildkit import mirror_context

    with locked_shared_context(settings, model) as shared:
        try:
            mirror_context(out_dir, shared)
        except OSError as e:
            shutil.rmtree(shared, ignore_errors=True)  # only a cache of links: rebuilt by the next render
            named = OSError(e.errno, e.strerror, str(shared))
            raise (
                disk_error(named, "write the shared build context")
                or RenderError(
                    f"could not write the shared build context {shared}: {e.strerror or e}; it was removed.",
                    hint="Check the cache directory ([paths] cache_dir, PIPELINE_CACHE_DIR), then render "
                    "again.",
                )
            ) from None
        except BaseException:
            shutil.rmtree(shared, ignore_errors=True)
            raise


def patched_files(atom: GitRepo, base: str, head: str) -> dict[str, str]:
    """{path: sha256 of its bytes at `head`} of every file the series changes (deleted: "")."""
    if base == head:
        return {}
    # --no-renames: a renamed file's old path is listed too (the self-check verifies it is gone)
    names = [n for n in atom.git("diff", "--no-renames", "--name-only", "-z", base, head).split("\0") if n]
    out: dict[str, str] = {}
    for name in names:
        data = atom.read_blob(head, name)
        out[name] = hashlib.sha256(data).hexdigest() if data is not None else ""
    return out


def recipe_tools(recipe_path: Path) -> tuple[list[str], list[str]]:
    """(executables, python modules) the recipe's checks run: the self-check wants them in the image."""
    from pipeline.errors import PipelineError
    from pipeline.recipes.recipe import load_recipe

    try:
        recipe = load_recipe(recipe_path)
    except PipelineError as e:
        raise RenderError(f"recipe {recipe_path} cannot be read: {e.message}", hint=e.hint) from None
    tools: list[str] = []
    modules: list[str] = []
    for check in recipe.checks:
        argv = list(getattr(check, "command", ()) or ())
        if not argv:
            continue
        if Path(argv[0]).name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
            modules.append(argv[2])
        elif Path(argv[0]).name.startswith("python") and len(argv) > 1:
            tools.append(argv[1])  # a script path
        else:
            tools.append(argv[0])
    return sorted(set(tools)), sorted(set(modules))


def render_context(
    *,
    lock: Lock,
    atom: GitRepo,
    atom_tree_sha: str,
    aiter: GitRepo,
    submodule_repos: Mapping[str, GitRepo | None],
    recipe_path: Path,
    settings: Settings,
    out_dir: Path,
    templates_dir: Path,
    source_date_epoch: int | None = None,
) -> RenderedContext:
    """Write the Dockerfile and the full build context into `out_dir` (replaced atomically)."""
    if not recipe_path.is_file():
        raise RenderError(
            f"recipe {recipe_path} does not exist.",
            hint="Write the model's recipe (recipes/<model>.yaml) or pass the right --model.",
        )
    template_hashes = template_sources(templates_dir)

    # ATOM: the patched commit must descend from the locked one.
    _resolve(atom, lock.atom.sha, "locked ATOM")
    atom_tree = _resolve(atom, atom_tree_sha, "patched ATOM")
    if atom_tree_sha != lock.atom.sha and not atom.is_ancestor(lock.atom.sha, atom_tree_sha):
        raise RenderError(
            f"patched ATOM commit {atom_tree_sha} does not descend from the locked ATOM commit "
            f"{lock.atom.sha}.",
            hint="Run `pipeline patch` again on the current lock.",
        )
    if not lock.applied_patches and atom_tree != atom.git("rev-parse", f"{lock.atom.sha}^{{tree}}"):
        raise RenderError(
            f"the lock applies no patch but ATOM commit {atom_tree_sha} differs from the locked "
            f"{lock.atom.sha}.",
            hint="Run `pipeline patch` again so the lock records the applied patches.",
        )
    aiter_tree = _resolve(aiter, lock.aiter.sha, "locked aiter")
    # The serving benchmark's --save-result format, read from the tree we build (never executed).
    from pipeline.smoke import benchfmt

    try:
        benchfmt.check_tree(
            lambda path: atom.read_blob(atom_tree_sha, path), recipe_path, where=f"ATOM {atom_tree_sha[:10]}"
        )
    except benchfmt.FormatError as e:
        raise RenderError(
            str(e),
            hint="Pin an ATOM whose benchmark_serving.py writes these keys, or update the serving-benchmark "
            "gate (pipeline/smoke/checks.py) and the recipe to what this ATOM writes.",
        ) from None

    # aiter's submodules: the aiter commit pins them, the lock must agree.
    gitlinks = dict(aiter.submodules(lock.aiter.sha))
    recorded = {s.path: s for s in lock.aiter.submodules}
    specs: list[SubmoduleSpec] = []
    missing: list[str] = []
    for path, sha in sorted(gitlinks.items()):
        rec = recorded.get(path)
        if rec is None or rec.sha != sha:
            raise RenderError(
                f"aiter {lock.aiter.short} pins submodule {path} at {sha}, the lock records "
                f"{rec.sha if rec else 'nothing'}.",
                hint="Run `pipeline pin` again to refresh the lock.",
            )
        # the rules pin applies (a file:// URL in the lock was checked against aiter's at pin)
        problem = submodule_url_problem(rec.url, rec.url, parent=lock.aiter.url, allow_file=True)
        if not _URL.match(rec.url) or problem is not None:
            raise RenderError(
                f"submodule {path} URL {rec.url!r} is not a plain git URL"
                + (f": {problem}." if problem else ".")
            )
        sub_repo = submodule_repos.get(path)
        if sub_repo is not None and sub_repo.rev_parse(sha) is not None:
            specs.append(SubmoduleSpec(path, rec.url, sha, "mirror"))
        elif settings.image.submodules == "in-build":
            specs.append(SubmoduleSpec(path, rec.url, sha, "in-build"))
        else:
            missing.append(f"{path} ({sha[:10]} from {rec.url})")
    if missing:
        raise RenderError(
            "no mirror holds aiter submodule " + ", ".join(missing) + "; nothing was rendered.",
            hint="Mirror it with `pipeline pin` while online, or pass `--submodules in-build` to fetch it "
            "inside the build at its pinned SHA (verified).",
        )
    for path in recorded:
        if path not in gitlinks:
            raise RenderError(f"the lock records submodule {path}, which aiter {lock.aiter.short} lacks.")

    out_dir = out_dir.resolve()
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise RenderError(
            f"{out_dir} exists and is not a rendered build context; refusing to overwrite it.",
            hint="Pass an empty or new directory with -o.",
        )
    tools, modules = recipe_tools(recipe_path)
    notes: list[str] = []
    # Unchanged files come from the previous render here, or from the engine's build directory.
    reuse_root = out_dir
    reuse = read_file_index(out_dir)
    if not reuse:
        reuse_root = shared_context_dir(settings, lock.model)
        reuse = read_file_index(reuse_root)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_stages(out_dir)
    # The umask's mode, not 0700; our pid in the name, so that a later render can tell it is stale.
    stage = make_temp_dir(out_dir.parent, prefix=f".{out_dir.name}.{os.getpid()}.", suffix="")
    old: Path | None = None
    try:
        wheel_hashes = link_wheelhouse(
            settings.wheels_dir,
            stage / WHEELS,
            required=settings.image.offline_build,
            python_version=settings.image.python_version,
        )
        if not wheel_hashes:
            notes.append(
                f"no wheelhouse at {settings.wheels_dir}: the image installs "
                f"{toolpins.LM_EVAL_REQUIREMENT} and {toolpins.SETUPTOOLS_SCM_REQUIREMENT} from the package "
                "index (`scripts/setup.sh image-wheelhouse` makes the build independent of it)"
            )
        aiter_requirements = aiter.read_blob(lock.aiter.sha, "requirements.txt") is not None
        if settings.sources.offline and not settings.image.offline_build:
            from_index = [
                *(["lm-eval and setuptools_scm (no wheelhouse)"] if not wheel_hashes else []),
                *(["aiter's requirements.txt"] if aiter_requirements else []),
                f"whatever `{settings.image.atom_install_cmd}` resolves",
            ]
            notes.append(
                "[sources] offline is true, but this image installs from the package index: "
                + "; ".join(from_index)
                + ". Its build needs the network; [image] offline_build = true builds from the wheelhouse "
                "only (`scripts/setup.sh image-wheelhouse` makes it)"
            )
        note = base_image_note(lock, settings)
        if note:
            notes.append(note)
        plan = plan_render(
            lock=lock,
            atom_tree=atom_tree,
            aiter_tree=aiter_tree,
            submodules=tuple(specs),
            settings=settings,
            template_hashes=template_hashes,
            source_date_epoch=source_date_epoch,
            atom_version=pep440_from_describe(
                _describe(atom, lock.atom.sha),
                lock.atom.sha,
                f"p{hashlib.sha256(atom_tree.encode()).hexdigest()[:8]}" if lock.applied_patches else "",
            ),
            aiter_version=pep440_from_describe(_describe(aiter, lock.aiter.sha), lock.aiter.sha),
            wheel_hashes=wheel_hashes,
            aiter_requirements=aiter_requirements,
        )
        texts = {
            DOCKERFILE: render_dockerfile(templates_dir, dockerfile_values(plan.values, buildkit=True)),
            DOCKERFILE_CLASSIC: render_dockerfile(
                templates_dir, dockerfile_values(plan.values, buildkit=False)
            ),
        }
        from pipeline.image import parity

        raw_list = settings.paths.parity_file
        parity_list = Path(raw_list) if raw_list else templates_dir / NOT_AN_INPUT
        upstream = atom.read_blob(lock.atom.sha, parity.UPSTREAM_DOCKERFILE)
        report = parity.compare(
            upstream.decode("utf-8", "replace") if upstream is not None else None,
            parity.load_deliberate(parity_list),
            atom_commit=lock.atom.sha,
        )
        index: FileIndex = {}
        export_tree(
            atom,
            atom_tree_sha,
            stage / "atom",
            prefix="atom/",
            reuse=reuse,
            reuse_root=reuse_root,
            index=index,
        )
        export_tree(
            aiter,
            lock.aiter.sha,
            stage / "aiter",
            prefix="aiter/",
            reuse=reuse,
            reuse_root=reuse_root,
            index=index,
        )
        for spec in specs:
            repo = submodule_repos.get(spec.path)
            if spec.source == "mirror" and repo is not None:
                sub_dir = stage / "aiter" / spec.path
                if sub_dir.exists():
                    shutil.rmtree(sub_dir)
                export_tree(
                    repo,
                    spec.sha,
                    sub_dir,
                    prefix=f"aiter/{spec.path}/",
                    reuse=reuse,
                    reuse_root=reuse_root,
                    index=index,
                )
        for name, text in texts.items():
            atomic_write_text(stage / name, text)
        atomic_write_text(stage / PAIR_NAME, PAIR_HEADER + lock.pair_toml())
        atomic_write_text(stage / ".dockerignore", DOCKERIGNORE)
        atomic_write_text(stage / PARITY, report.markdown)
        atomic_write_json(stage / FILES_INDEX, {k: list(v) for k, v in sorted(index.items())})
        img = settings.image
        atomic_write_json(
            stage / MANIFEST,
            {
                "inputs_digest": plan.inputs_digest,
                "image_ref": plan.image_ref,
                "labels": plan.labels,
                "dockerfile_sha256": sha256_bytes(texts[DOCKERFILE].encode()),
                "dockerfiles": {name: sha256_bytes(text.encode()) for name, text in texts.items()},
                "base_image": lock.base_image.pinned,
                "model": lock.model,
                "atom_commit": atom_tree_sha,
                "inputs": plan.inputs,
                "parity": {"summary": report.summary, "uncovered": report.uncovered},
                "build": {"network": img.network, "secrets": list(img.build_secrets)},
                "aiter_stage": {
                    "target": AITER_STAGE,
                    "key": aiter_stage_key(texts[DOCKERFILE], aiter_tree, tuple(specs), wheel_hashes),
                },
                "selfcheck": {
                    "aiter_dir": AITER_DIR,
                    "atom_dir": ATOM_DIR,
                    "aiter_version": plan.values["aiter_version"],
                    "atom_version": plan.values["atom_version"],
                    "patched_files": patched_files(atom, lock.atom.sha, atom_tree_sha),
                    "tools": tools,
                    "modules": modules,
                    "lm_eval_version": toolpins.LM_EVAL_VERSION,
                },
            },
        )
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
            os.replace(out_dir, old)
        os.replace(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None and not out_dir.exists():
            os.replace(old, out_dir)  # interrupted between the two renames: the previous context stays
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)  # killed meanwhile: the next render sweeps it
    mirror_shared_context(out_dir, settings, lock.model)
    return RenderedContext(
        dir=out_dir,
        dockerfile=out_dir / DOCKERFILE,
        inputs_digest=plan.inputs_digest,
        labels=plan.labels,
        image_ref=plan.image_ref,
        parity_summary=report.summary,
        notes=tuple(notes),
    )
