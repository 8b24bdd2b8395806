"""BuildKit builds through the docker CLI (`DOCKER_BUILDKIT=1 docker build --progress=plain`).

Why the CLI: the docker SDK's `/build` endpoint speaks the classic builder only. On Debian
bookworm the BuildKit that `docker.io` (20.10) carries inside dockerd is driven by the `docker`
CLI of the same package; Debian packages no `buildx` or `buildctl` for bookworm, and
python-on-whales builds through `docker buildx`, so it needs the plug-in we do not have. The CLI
gives what we need: RUN --mount (cache, bind, secret), `--secret id=NAME,env=NAME`, inline cache
(`BUILDKIT_INLINE_CACHE=1`) with `--cache-from <registry ref>`, incremental context transfer
from a stable directory, and target pruning. A CLI with buildx (docker >= 23) takes the same
command line. What the 20.10 front end cannot do: provenance (SLSA) and SBOM attestations
(they need buildx >= 0.10 with BuildKit >= 0.11) and `--cache-to` of type registry.

Where the CLI has buildx, `build(..., buildx=BuildxOptions(...))` builds through it instead:
`docker buildx build --builder B` (a remote or docker-container builder), registry cache
(`--cache-from`/`--cache-to type=registry,...,mode=max`), `--provenance=mode=max --sbom=true`,
`--metadata-file`, and `--push` (attestations kept in the registry) or `--load`. buildx cannot be
installed on the machines this is developed on: that path is tested against a stand-in `docker`
that records its arguments and writes a metadata file (tests/git/test_buildx.py).

`find_cli()` picks a CLI that can drive BuildKit (the newer static `docker` earlier on PATH
without buildx refuses it); `engine_has_buildkit()` asks the engine. Builds return the same
`BuiltImage` as the classic path (steps named `[stage i/n] INSTRUCTION`, cache hits), plus the
bytes of context BuildKit transferred.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import BuildError, InfraError
from pipeline.oci.engine import BuiltImage, EngineAPI

# Attestations: what this front end says about provenance and SBOM (the verification record links it).
ATTESTATIONS_UNSUPPORTED = (
    "not produced: the docker CLI 20.10 drives the engine's BuildKit v0.8, which has no provenance "
    "(SLSA) or SBOM attestations; they need buildx >= 0.10 with BuildKit >= 0.11"
)

_VERTEX = re.compile(r"^#(\d+) (.*)$")
_STEP = re.compile(r"^\[(?:(\S+) )?(\d+)/(\d+)\] (.*)$")
_TRANSFER = re.compile(r"transferring context: ([0-9.]+)([kMG]?B)")
_UNITS = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
_MOUNT = re.compile(r"--mount=\S+\s+")
TAIL_MARKER = "--- last lines of the failing step ---\n"


@dataclass(frozen=True)
class BuildKitImage(BuiltImage):
    context_bytes: int = 0  # what BuildKit transferred of the build context
    cli: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)  # buildx --metadata-file, as written


@dataclass(frozen=True)
class BuildxOptions:
    """How a buildx build differs from the 20.10 CLI's: where it builds and what it keeps."""

    builder: str = ""  # --builder (a remote or docker-container builder); "" the CLI's current one
    cache_to: str = ""  # registry reference the build cache is exported to (mode=max)
    push: str = ""  # push the result to this reference (attestations kept)
    load: bool = True  # else: load the result into the engine (False: a stage built for its cache only)
    attest: bool = True  # --provenance=mode=max --sbom=true (a push keeps them; a load cannot)


@dataclass(frozen=True)
class CliChoice:
    path: str
    version: str
    buildx: bool


def _run(
    argv: Sequence[str], env: Mapping[str, str], timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def find_cli(configured: str, env: Mapping[str, str]) -> CliChoice | None:
    """The first docker CLI that can drive BuildKit: buildx present, or a CLI older than 23."""
    candidates: list[str] = []
    if configured:
        candidates.append(configured)
    else:
        for d in env.get("PATH", os.defpath).split(os.pathsep):
            p = os.path.join(d, "docker")
            if os.access(p, os.X_OK) and p not in candidates:
                candidates.append(p)
        if os.access("/usr/bin/docker", os.X_OK) and "/usr/bin/docker" not in candidates:
            candidates.append("/usr/bin/docker")
    for path in candidates:
        try:
            version = _run([path, "version", "--format", "{{.Client.Version}}"], env).stdout.strip()
            buildx = _run([path, "buildx", "version"], env).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.match(r"^(\d+)\.", version)
        if buildx or (m and int(m.group(1)) < 23):
            return CliChoice(path, version, buildx)
    return None


def engine_has_buildkit(engine: EngineAPI) -> bool:
    """BuildKit is in dockerd since 18.09 (API 1.39); a Windows engine has none."""
    info = engine.version()
    try:
        major, minor = (int(x) for x in str(info.get("ApiVersion", "0.0")).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (1, 39) and str(info.get("Os", "linux")) == "linux"


def _size(value: str, unit: str) -> int:
    return int(float(value) * _UNITS[unit])


class _Progress:
    """Reads `--progress=plain` output: vertices, steps, cache hits, the context transferred."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self.on_line = on_line
        self.lines: list[str] = []
        self.names: dict[str, str] = {}
        self.steps: list[str] = []
        self.cached: list[str] = []
        self.errors: dict[str, str] = {}
        self.output: dict[str, list[str]] = {}
        self.transfer: dict[str, int] = {}
        self.last_vertex = ""

    def feed(self, line: str) -> None:
        self.lines.append(line)
        if self.on_line is not None:
            self.on_line(line)
        m = _VERTEX.match(line)
        if not m:
            return
        vid, rest = m.group(1), m.group(2)
        self.last_vertex = vid
        if vid not in self.names and not re.match(r"^(DONE|CACHED|ERROR|sha256:|\d+\.\d+ )", rest):
            self.names[vid] = rest
            step = _STEP.match(rest)
            if step:
                self.steps.append(self.title(vid))
            return
        if rest == "CACHED":
            title = self.title(vid)
            if title in self.steps and title not in self.cached:
                self.cached.append(title)
        elif rest.startswith("ERROR"):
            self.errors[vid] = rest.partition(":")[2].strip() or rest
        else:
            t = _TRANSFER.search(rest)
            if t and "context" in self.names.get(vid, ""):
                self.transfer[vid] = _size(t.group(1), t.group(2))
            if not rest.startswith("sha256:"):
                self.output.setdefault(vid, []).append(re.sub(r"^\d+\.\d+ ", "", rest))

    def title(self, vid: str) -> str:
        """`[stage i/n] INSTRUCTION`, RUN --mount flags dropped (they are how, not what)."""
        return _MOUNT.sub("", self.names.get(vid, f"#{vid}"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def build(
    cli: CliChoice,
    context: Path,
    *,
    dockerfile: str = "Dockerfile",
    tag: str | None = None,
    labels: Mapping[str, str] | None = None,
    buildargs: Mapping[str, str] | None = None,
    target: str | None = None,
    nocache: bool = False,
    network: str = "",
    secrets: Mapping[str, str] | None = None,
    cache_from: Sequence[str] = (),
    inline_cache: bool = True,
    docker_host: str | None = None,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    buildx: BuildxOptions | None = None,
) -> BuildKitImage:
    """Build `context` with BuildKit; BuildError names the failing `[stage i/n] ...` step.

    `secrets` maps a secret id to its value; values reach the CLI only through its environment
    (`--secret id=X,env=...`), never its argv, a build argument, the log or an error.
    """
    if not (context / dockerfile).is_file():
        raise BuildError(
            f"No {dockerfile} in the build context {context}.",
            hint="Render the build context first (`pipeline render`).",
        )
    base_env = dict(os.environ if env is None else env)
    run_env = {k: v for k, v in base_env.items() if not k.startswith("ATOM_SECRET_")}
    run_env["DOCKER_BUILDKIT"] = "1"
    if docker_host:
        run_env["DOCKER_HOST"] = docker_host
    if buildx is not None and not cli.buildx:
        raise BuildError(f"the docker CLI {cli.path} has no buildx plug-in; build without buildx options.")
    with tempfile.TemporaryDirectory(prefix="atom-buildkit-") as tmp:
        iidfile = Path(tmp) / "iid"
        metadata_file = Path(tmp) / "metadata.json"
        argv = [cli.path, *(["buildx"] if buildx is not None else []), "build", "--progress=plain"]
        argv += ["--iidfile", str(iidfile), "-f", str(context / dockerfile)]
        if buildx is not None:
            argv += _buildx_flags(buildx, metadata_file, tag)
        if network:
            argv += ["--network", network]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        for key, value in (buildargs or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        if inline_cache and buildx is None:
            argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
        for ref in cache_from:
            argv += ["--cache-from", f"type=registry,ref={ref}" if buildx is not None else ref]
        for i, (sid, value) in enumerate(sorted((secrets or {}).items())):
            var = f"ATOM_SECRET_{i}"
            run_env[var] = value
            argv += ["--secret", f"id={sid},env={var}"]
        if target:
            argv += ["--target", target]
        if nocache:
            argv.append("--no-cache")
        if tag and buildx is None:
            argv += ["-t", tag]
        argv.append(str(context))
        progress = _Progress(on_line)
        secret_values = [v for v in (secrets or {}).values() if v]
        try:
            proc = subprocess.Popen(
                argv,
                env=run_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
        except OSError as e:
            raise InfraError(f"could not run the docker CLI {cli.path}: {e.strerror}.") from None
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                for s in secret_values:
                    line = line.replace(s, "***")
                progress.feed(line)
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != 0:
            raise _error(progress, tag, code)
        image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        metadata = _read_metadata(metadata_file) if buildx is not None else {}
    if buildx is not None and buildx.push and not image_id:
        image_id = str(metadata.get("containerimage.config.digest", ""))  # nothing loaded: the config
    cache_only = buildx is not None and not buildx.push and not buildx.load  # a stage for its cache
    if not image_id and not cache_only:
        raise _error(progress, tag, code, "the build finished without an image id")
    return BuildKitImage(
        id=image_id,
        log=progress.text,
        steps=list(progress.steps),
        cached=list(progress.cached),
        context_bytes=sum(progress.transfer.values()),
        cli=cli.path,
        metadata=metadata,
    )


def _buildx_flags(opts: BuildxOptions, metadata_file: Path, tag: str | None) -> list[str]:
    flags = ["--metadata-file", str(metadata_file)]
    if opts.builder:
        flags += ["--builder", opts.builder]
    if opts.cache_to:
        flags += ["--cache-to", f"type=registry,ref={opts.cache_to},mode=max"]
    if opts.attest:
        flags += ["--provenance=mode=max", "--sbom=true"]
    if opts.push:
        flags += ["-t", opts.push, "--push"]
    elif opts.load:
        flags += [*(["-t", tag] if tag else []), "--load"]
    return flags


def _read_metadata(path: Path) -> dict[str, Any]:
    """buildx's --metadata-file (image digest, descriptor, provenance); {} when it wrote none."""
    import json

    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8")[:1_000_000])
    except ValueError as e:
        raise BuildError(f"buildx wrote a metadata file that is not JSON: {e}.") from None
    return data if isinstance(data, dict) else {}


_ENGINE_GONE = ("Cannot connect to the Docker daemon", "error during connect", "connection refused")
# A registry the engine cannot reach, as Go's resolver and dialer word it.
_UNREACHABLE = ("no such host", "dial tcp", "i/o timeout", "network is unreachable", "TLS handshake timeout",
                "connection refused", "server misbehaving")  # fmt: skip


def _error(progress: _Progress, tag: str | None, code: int, reason: str = "") -> BuildError | InfraError:
    text = progress.text
    if not progress.steps and any(s in text for s in _ENGINE_GONE):
        return InfraError(
            f"The docker CLI could not reach the engine to build{f' {tag}' if tag else ''}: "
            + text.strip()[-400:],
            hint="Start the engine or point DOCKER_HOST / --docker-host at one.",
            evidence=text,
        )
    failed = next(iter(progress.errors), "") or progress.last_vertex
    step = progress.title(failed) if failed else "before the first step"
    why = reason or progress.errors.get(failed, "") or f"docker build exited {code}"
    if step.startswith("[internal] load metadata for") and any(s in why for s in _UNREACHABLE):
        # the base image's registry cannot be reached: the network, not the build, failed
        return InfraError(
            f"The image build{f' of {tag}' if tag else ''} could not pull its base image: "
            f"{step.removeprefix('[internal] load metadata for ')} is in a registry the engine cannot reach "
            f"({why.strip()[-200:]}).",
            hint="Give the engine network access to that registry, or load the base image on the engine "
            "(`docker load`/`docker pull` where it can reach it), or mirror it into a registry it reaches "
            "and set [image] base_image to that reference.",
            evidence=text,
        )
    tail = "\n".join(progress.output.get(failed, [])[-40:]) or "\n".join(progress.lines[-40:])
    return BuildError(
        f"The image build{f' of {tag}' if tag else ''} failed at {step}: {why.strip()}",
        hint="The full build log is in the run directory; the end of the failing step is shown above.",
        evidence=f"{text}\n\n{TAIL_MARKER}{tail}",
    )


def mirror_context(src: Path, dest: Path) -> None:
    """Make `dest` hold exactly `src` through hard links (same inode: same mtime, no copy).

    BuildKit keys its incremental context transfer on the directory's path, and skips files
    whose metadata did not change: building from one stable directory per model sends only
    what changed since the last build there.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wanted: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        for name in dirnames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            s = src / rel
            d = dest / rel
            wanted.add(rel)
            if s.is_symlink():
                _replace_link(s, d)
            else:
                if d.is_symlink() or (d.exists() and not d.is_dir()):
                    d.unlink()
                d.mkdir(exist_ok=True)
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            wanted.add(rel)
            s, d = src / rel, dest / rel
            if s.is_symlink():
                _replace_link(s, d)
                continue
            try:
                if d.exists() and not d.is_symlink() and os.path.samefile(s, d):
                    continue
            except OSError:
                pass
            tmp = d.with_name(f".{d.name}.link-{os.getpid()}")
            try:
                os.link(s, tmp)
            except OSError:
                shutil.copy2(s, tmp)
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
            os.replace(tmp, d)
    for dirpath, dirnames, filenames in os.walk(dest, topdown=False):
        rel_dir = os.path.relpath(dirpath, dest)
        for name in filenames + dirnames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel not in wanted:
                p = dest / rel
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()


def _replace_link(src: Path, dest: Path) -> None:
    target = os.readlink(src)
    if dest.is_symlink() and os.readlink(dest) == target:
        return
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.symlink(target, dest)
