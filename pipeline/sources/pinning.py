"""Pinning: both sources resolved to full SHAs in their mirrors, aiter's submodules, the base image digest."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pipeline.config import Settings
from pipeline.errors import InfraError, SourceError, TagError, UsageError, sentence
from pipeline.gitw import CommitInfo, GitRepo
from pipeline.lock import BaseImagePin, Lock, SourcePin, Sources, Submodule
from pipeline.log import Logger
from pipeline.sources.mirrors import fetch_commit, keep_pinned, open_mirror
from pipeline.sources.refs import resolve_ref
from pipeline.sources.submodules import _mirror_submodule, read_submodules, submodule_mirror
from pipeline.sources.urls import is_local, normalise_url, validate_model

DigestResolver = Callable[[str], "str | None"]
# Chooses the aiter commit to pin from (atom mirror, atom commit, aiter mirror, aiter commit
# resolved from the requested ref). `pipeline pin --auto` composes one in the pin stage
# (pipeline.stages.pin) from the compat search: sources knows nothing of compat or patches.
AiterChooser = Callable[[GitRepo, CommitInfo, GitRepo, CommitInfo], CommitInfo]


def default_digest_resolver(ref: str, env: Mapping[str, str] | None = None) -> str | None:
    """The registry's digest for `ref` (Docker config credentials from `env`), None if none answers."""
    from pipeline.oci.registry import resolve_digest

    return resolve_digest(ref, timeout=10.0, env=env)


def _same_image(previous: BaseImagePin, ref: str) -> bool:
    """An earlier pin with a digest for this image (given as NAME:TAG, or by hand as NAME:TAG@sha256:…)."""
    return bool(previous.digest) and previous.ref.split("@", 1)[0] == ref


def pin_base_image(
    ref: str,
    *,
    log: Logger,
    resolver: DigestResolver | None = None,
    previous: BaseImagePin | None = None,
    env: Mapping[str, str] | None = None,
    offline: bool = False,
    require_digest: bool = False,
) -> BaseImagePin:
    """Keep `ref` as given; add its digest when a registry answers.

    No registry answering keeps the digest of an earlier lock for the same reference; with none,
    `require_digest` makes it an InfraError (exit 11; offline: a UsageError, the digest must be
    given), else a warning and a lock render refuses. A registry that answers "no such image" or
    refuses access is an error: pinning must not hide it. `offline` asks no registry: the digest
    is the one in `ref`, or the earlier lock's.
    """
    ref = ref.strip()
    if not ref:
        raise UsageError("the base image reference is empty.", hint="Pass --base-image or set base_image.")
    m = re.search(r"@(sha256:[0-9a-f]{64})$", ref)
    if m:
        return BaseImagePin(ref=ref, digest=m.group(1))
    fix = (
        f"Give it with the digest: --base-image {ref}@sha256:DIGEST (flag of `pipeline pin` and "
        "`pipeline build`), or [image] base_image in pipeline.toml; `docker image inspect "
        "--format '{{.RepoDigests}}' IMAGE` shows it where the image was pulled."
    )
    if offline:
        if previous is not None and _same_image(previous, ref):
            log.info(f"offline: base image {ref} keeps the digest of the existing lock ({previous.digest})")
            return previous
        if require_digest:
            raise UsageError(
                f"offline: no registry is asked for the digest of base image {ref}, and the reference "
                "has none.",
                hint=f"{sentence(fix)} Or pass `pipeline pin --no-base-digest` to pin the sources "
                "alone (render refuses such a lock).",
            )
        log.warn(
            f"offline: no registry asked for the digest of base image {ref}, so none is pinned "
            f"and render will refuse the lock. {fix}"
        )
        return BaseImagePin(ref=ref, digest="")
    digest: str | None
    failure = ""
    try:
        digest = resolver(ref) if resolver is not None else default_digest_resolver(ref, env)
    except InfraError as e:
        log.detail(f"digest lookup for {ref} failed: {e}")
        digest, failure = None, f" ({e.message.rstrip('.')})"
    except TagError as e:  # the registry answered and refused: a source problem for pin
        raise SourceError(f"base image {ref}: {e.message}", hint=e.hint, evidence=e.evidence) from e
    if digest:
        return BaseImagePin(ref=ref, digest=digest)
    if previous is not None and _same_image(previous, ref):
        log.warn(
            f"no registry answered for base image {ref}; keeping the digest from the existing lock "
            f"({previous.digest})."
        )
        return previous
    if require_digest:
        raise InfraError(
            f"no registry answered for the digest of base image {ref}{failure}; nothing was pinned.",
            hint=f"Run again where the registry answers. {sentence(fix)} Or pass "
            "`pipeline pin --no-base-digest` to pin the sources alone (render refuses such a lock).",
        )
    log.warn(f"no registry answered for base image {ref}; kept as given (no digest pinned). {fix}")
    return BaseImagePin(ref=ref, digest="")


@dataclass(frozen=True)
class PinResult:
    lock: Lock
    atom_repo: GitRepo
    aiter_repo: GitRepo
    # aiter commit the requested ref resolved to (differs from the pin with --auto)
    aiter_requested: CommitInfo


def _source_pin(url: str, ref: str, info: CommitInfo, submodules: tuple[Submodule, ...] = ()) -> SourcePin:
    return SourcePin(
        url=url, ref=ref, sha=info.sha, date=info.iso_date, subject=info.subject, submodules=submodules
    )


def _resolve_in_mirror(
    repo: GitRepo, ref: str, *, url: str, name: str, fetch: bool, log: Logger
) -> CommitInfo:
    try:
        return resolve_ref(repo, ref, url=url, name=name)
    except SourceError:
        # A full SHA on no branch (e.g. a PR commit) can still be fetched by SHA.
        if (
            fetch
            and re.fullmatch(r"[0-9a-fA-F]{40}", ref)
            and fetch_commit(repo, ref.lower(), url=url, log=log)
        ):
            return resolve_ref(repo, ref, url=url, name=name)
        raise


def pin(
    settings: Settings,
    *,
    model: str,
    atom_ref: str,
    aiter_ref: str,
    base_image: str,
    log: Logger,
    offline: bool = False,
    previous: Lock | None = None,
    digest_resolver: DigestResolver | None = None,
    choose_aiter: AiterChooser | None = None,
    env: Mapping[str, str] | None = None,
    require_base_digest: bool = False,
) -> PinResult:
    """Resolve both sources to full SHAs (mirroring as needed).

    Returns the Lock, the two mirrors and the aiter commit that was asked for (for reports).
    """
    validate_model(model)
    atom_url = normalise_url(settings.sources.atom_repo)
    aiter_url = normalise_url(settings.sources.aiter_repo)
    # Offline: no network. Local paths are still mirrored and fetched (that is no network);
    # URLs are read from their existing mirrors only, and no registry is asked.
    offline = offline or settings.sources.offline
    atom_fetch = not offline or is_local(atom_url)
    aiter_fetch = not offline or is_local(aiter_url)

    atom_repo = open_mirror(settings, atom_url, fetch=atom_fetch, log=log)
    atom = _resolve_in_mirror(atom_repo, atom_ref, url=atom_url, name="ATOM", fetch=atom_fetch, log=log)
    aiter_repo = open_mirror(settings, aiter_url, fetch=aiter_fetch, log=log)
    aiter_req = _resolve_in_mirror(
        aiter_repo, aiter_ref, url=aiter_url, name="aiter", fetch=aiter_fetch, log=log
    )

    aiter = aiter_req
    aiter_ref_recorded = aiter_ref
    if choose_aiter is not None:
        aiter = choose_aiter(atom_repo, atom, aiter_repo, aiter_req)
        aiter_ref_recorded = f"auto:{aiter_ref}"

    subs = read_submodules(aiter_repo, aiter.sha, parent_url=aiter_url)
    if subs and settings.sources.mirror_submodules:
        for sub in subs:
            if not offline or (sub.url and is_local(sub.url)):
                _mirror_submodule(settings, sub, log)
            elif submodule_mirror(settings, sub.url) is None:
                log.warn(
                    f"offline: submodule {sub.path} ({sub.url}) has no mirror; its SHA is pinned. "
                    f"Render it from a local clone (`--submodule-repo {sub.path}=PATH`) or fetch it in "
                    "the build (`--submodules in-build`, or [image] submodules)."
                )

    keep_pinned(atom_repo, atom.sha)
    keep_pinned(aiter_repo, aiter.sha)

    base = pin_base_image(
        base_image,
        log=log,
        resolver=digest_resolver,
        previous=previous.base_image if previous is not None else None,
        env=env,
        offline=offline,
        require_digest=require_base_digest,
    )
    lock = Lock(
        model=model,
        sources=Sources(
            atom=_source_pin(atom_url, atom_ref, atom),
            aiter=_source_pin(aiter_url, aiter_ref_recorded, aiter, subs),
        ),
        base_image=base,
    )
    if (
        previous is not None
        and previous.atom.sha == lock.atom.sha
        and previous.aiter.sha == lock.aiter.sha
        and previous.patches
    ):
        lock = lock.with_patches(previous.patches)
    return PinResult(lock=lock, atom_repo=atom_repo, aiter_repo=aiter_repo, aiter_requested=aiter_req)
