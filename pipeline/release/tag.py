"""`pipeline tag`: push a verified image by digest, and only then move the moving tags.

The flow, each step refusing with its own message before anything is changed:

1. the smoke verdict is loaded and must be bound to this image, recipe and lock
   (`check_binding`): passed as derived from its checks (every gate its recipe
   requires, passed; never its top-level `passed`), same image ID, the image's labels carry the
   verdict's pair and inputs digests, the recipe and lock files on disk are the ones the
   verdict was made with, and the lock pins the image's pair (the image names no model: one
   image serves every model whose lock pins its pair; the verdict binds model, lock and image);
2. the immutable tag (`settings.tag.tag_template`) and the moving tags are
   computed and validated against the registry tag grammar;
3. under a file lock per (registry, repository): the verdict's digest (the image the smoke
   test ran, by digest: `bound_digest`) must be in the target repository as this image;
   if the immutable tag already exists it must hold this very image (immutable means
   immutable), else that digest's manifest is PUT as the immutable tag (no layer, no
   local tag, no name that may have moved is pushed); the digest is read back from the
   registry API and must be the verdict's;
4. the verification record (`record.json`, an in-toto Statement) is written
   next to the verdict and, if asked, attested with cosign;
5. only then each moving tag is PUT to that digest (no layer is re-pushed).
   A failure while moving restores the tags already moved to where they were.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

from pipeline import labels
from pipeline.config import Settings
from pipeline.errors import ConfigError, InfraError, PipelineError, TagError, UsageError, sentence
from pipeline.fsutil import acquire_lock, sha256_file
from pipeline.image.provenance import record_attestations
from pipeline.lock import Lock, default_lock_path
from pipeline.log import Logger
from pipeline.oci.engine import EngineAPI, ImageInfo
from pipeline.oci.registry import (
    MEDIA_DOCKER_MANIFEST,
    MEDIA_OCI_MANIFEST,
    ImageRef,
    RegistryAuthError,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    credentials_for,
    default_scheme,
    parse_image_ref,
    tag_problem,
)
from pipeline.recipes.recipe import load_recipe
from pipeline.release.moving_tags import MoveOutcome, Mover, current
from pipeline.release.record import (
    PREDICATE_TYPE,
    RecordInputs,
    build_statement,
    keep_earlier_attempt,
    write_record,
)
from pipeline.retry import GaveUp, with_retries
from pipeline.smoke.verdict import Verdict, VerdictFile, derive, read_verdict, required_gates

TEMPLATE_FIELDS = ("model", "date", "atom7", "aiter7", "patchset", "inputs7")
RERUN = "Re-run `pipeline smoke` for this image (it writes a fresh verdict), then `pipeline tag` again."


# --------------------------------------------------------------------------- verdict


def read_tag_verdict(path: Path) -> VerdictFile:
    """The smoke verdict (`pipeline.smoke.verdict`, the one model); a TagError refusal when unreadable.

    A missing or foreign document is a refusal to tag, not a configuration error.
    """
    try:
        return read_verdict(
            path,
            error=TagError,
            hint="Run `pipeline smoke` for this image first, or pass --verdict with the right path.",
        )
    except TagError as e:
        raise TagError(f"refusing to tag: {e.message}", hint=e.hint or RERUN) from None


def check_passed(vf: VerdictFile, image: str, recipe_path: Path | None = None) -> Path:
    """Refuse a verdict that did not pass, or that says it passed when its checks do not; the recipe.

    Needs no engine (checked first). The result is derived from the checks against the gates
    of the recipe the verdict is bound to (its sha256), never read from `passed`/`status`.
    """
    where = f"the smoke verdict {vf.path}"
    verdict = vf.verdict
    if verdict.status != "passed" or not verdict.passed:
        why = {
            "failed": "the smoke test failed",
            "no-hardware": "the smoke test did not run (no GPUs or model cache on that machine)",
            "error": "the smoke test could not complete",
        }.get(verdict.status, f"its status is '{verdict.status}'")
        raise TagError(
            f"refusing to tag {image}: {where} did not pass: {why}"
            + (f" ({verdict.reason})." if verdict.reason else "."),
            hint="Only a passed smoke test can tag an image. Fix the failure and run `pipeline smoke` again.",
        )
    recipe = bound_recipe(vf, image, recipe_path)
    try:
        required = required_gates(load_recipe(recipe), verdict.options)
    except ValueError as e:
        raise TagError(f"refusing to tag {image}: {where} disagrees with itself: {e}.", hint=RERUN) from None
    derived = derive(verdict, required)
    if not derived.passed:
        raise TagError(
            f"refusing to tag {image}: {where} disagrees with itself: it says passed, but "
            + "; ".join(derived.problems)
            + f" (the recipe {recipe} requires {', '.join(required)}).",
            hint="A verdict passes only when every gate its recipe requires passed. " + RERUN,
        )
    return recipe


def bound_recipe(vf: VerdictFile, image: str, recipe_path: Path | None) -> Path:
    """The recipe file the verdict was made with (its sha256 now is the verdict's): stale otherwise."""
    verdict = vf.verdict
    recipe = recipe_path or (Path(verdict.recipe.path) if verdict.recipe.path else None)
    if recipe is None:
        raise UsageError("the verdict names no recipe file; pass --recipe FILE.")
    if not recipe.is_file():
        raise UsageError(
            f"recipe file {recipe} does not exist.",
            hint="Pass --recipe with the recipe the image was smoke-tested with.",
        )
    recipe_sha = sha256_file(recipe)
    if recipe_sha != verdict.recipe.sha256:
        raise TagError(
            f"refusing to tag {image}: the recipe {recipe} changed since the smoke test (stale verdict): "
            f"it is now {_short(recipe_sha)}, the verdict was made with {_short(verdict.recipe.sha256)}.",
            hint=RERUN,
        )
    return recipe


@dataclass(frozen=True)
class BoundVerdict:
    """A verdict checked against the image, recipe and lock it must belong to."""

    verdict: VerdictFile
    image: ImageInfo
    lock: Lock
    lock_path: Path
    recipe_path: Path


def check_binding(
    vf: VerdictFile,
    info: ImageInfo | None,
    *,
    image: str,
    lock_path: Path | None,
    recipe_path: Path | None,
    locks_dir: Path,
) -> BoundVerdict:
    """Refuse a failed, foreign, unproven or stale verdict, each with its own message."""
    where = f"the smoke verdict {vf.path}"
    verdict = vf.verdict
    recipe = check_passed(vf, image, recipe_path)
    if info is None:
        raise TagError(
            f"refusing to tag: the image {image} does not exist in the Docker engine.",
            hint="Build it (`pipeline build`) or pass --image with the reference the verdict names"
            + (f" ({verdict.image.ref})." if verdict.image.ref else "."),
        )
    if verdict.image.id != info.id:
        raise TagError(
            f"refusing to tag {image}: {where} is for another image (foreign verdict): it names image ID "
            f"{_short(verdict.image.id)} ({verdict.image.ref or 'no ref'}), "
            f"but {image} is {_short(info.id)}.",
            hint="Pass the verdict of this image, or " + RERUN[0].lower() + RERUN[1:],
        )
    check_server_evidence(vf, info, image)
    lbl = info.labels
    for key, expected, what in (
        (labels.PAIR_DIGEST, verdict.pair_digest, "pair"),
        (labels.INPUTS_DIGEST, verdict.inputs_digest, "inputs digest"),
    ):
        got = lbl.get(key)
        if not got and key == labels.PAIR_DIGEST and lbl.get(labels.OLD_LOCK_SHA256):
            raise TagError(
                f"refusing to tag {image}: it was built by an older version of this pipeline, whose images "
                f"named their model ({labels.OLD_LOCK_SHA256}); this one binds a model's lock to an image "
                f"by the image's {labels.PAIR_DIGEST} label, which it lacks.",
                hint="Rebuild it (`pipeline build --model MODEL`) and smoke-test the new image, then tag it.",
            )
        if not got:
            raise TagError(
                f"refusing to tag {image}: the image has no label {key}, so it was not built by this "
                "pipeline and cannot be bound to a verdict.",
                hint="Build the image with `pipeline build`, smoke-test it, then tag it.",
            )
        if got != expected:
            raise TagError(
                f"refusing to tag {image}: the image's {what} ({key}={_short(got)}) differs from the one in "
                f"{where} ({_short(expected)}): the verdict does not belong to this image's build.",
                hint=RERUN,
            )
    # model -> lock -> image: the verdict names the model's lock, whose pair the image is built from
    if not verdict.lock_sha256:
        raise TagError(
            f"refusing to tag {image}: {where} binds no lock (smoke ran without the model's lock), so "
            "nothing says which model's lock this image serves.",
            hint="Re-run `pipeline smoke` with --lock (the model's lock), then `pipeline tag` again.",
        )
    if lock_path is None:
        model = verdict.recipe.name
        if not model:
            raise UsageError(f"cannot tell which lock file {image} was smoke-tested with; pass --lock FILE.")
        lock_path = default_lock_path(locks_dir, model)
    lock = Lock.load(lock_path)
    lock.require_pair(lbl, image, name=f"lock file {lock_path}", done="nothing was pushed or moved")
    if lock.digest() != verdict.lock_sha256:
        raise TagError(
            f"refusing to tag {image}: the lock file {lock_path} changed since the image was built and "
            f"smoke-tested (stale verdict): it is now {_short(lock.digest())}, the verdict was made with "
            f"{_short(verdict.lock_sha256)}.",
            hint="Rebuild from the current lock (`pipeline build`) and smoke-test it, or restore the lock.",
        )
    return BoundVerdict(vf, info, lock, lock_path, recipe)


def check_server_evidence(vf: VerdictFile, info: ImageInfo, image: str) -> None:
    """The verdict must prove that the server answering its probes ran this very image."""
    server = vf.verdict.server
    if server is None or not server.proven_by or not server.container_id:
        raise TagError(
            f"refusing to tag {image}: the smoke verdict {vf.path} does not prove which server answered "
            "its probes (no server identity evidence: made by an older pipeline, or never proven).",
            hint=RERUN,
        )
    if server.image_id != info.id:
        raise TagError(
            f"refusing to tag {image}: the server that answered the smoke test ran image "
            f"{_short(server.image_id)} (container {server.container_name}, {server.container_id[:12]}), "
            f"not {image} ({_short(info.id)}): the verdict's evidence does not bind to this image.",
            hint=RERUN,
        )


def bound_digest(vf: VerdictFile, image: str) -> str:
    """The registry digest the verdict was made for: the only thing `tag` pushes.

    A verdict of an image never pushed (bound by image ID only) is refused: tagging it would
    push whatever the engine makes of that image now, which nobody smoke-tested by digest.
    """
    digest = vf.verdict.image.digest
    if not digest:
        raise TagError(
            f"refusing to tag {image}: the smoke verdict {vf.path} is bound to image ID "
            f"{_short(vf.verdict.image.id)} only, not to a registry digest (the image was never pushed, or "
            "was smoke-tested by a local name); tag pushes only the digest that was smoke-tested.",
            hint="Push the candidate to the target registry (`pipeline build` does when [tag] registry is "
            "set), smoke-test it by digest (`pipeline smoke --image REPO@sha256:…`), then tag with that "
            "verdict. Nothing was pushed.",
        )
    return digest


def _short(digest: str) -> str:
    d = digest.removeprefix("sha256:")
    return d[:12] if d else "(none)"


# --------------------------------------------------------------------------- tag names


def patchset_id(lock: Lock) -> str:
    """`0` with no applied patch, else `<count>.<sha7 over the applied patches' sha256s>`."""
    applied = lock.applied_patches
    if not applied:
        return "0"
    h = hashlib.sha256("\n".join(p.sha256 for p in applied).encode()).hexdigest()[:7]
    return f"{len(applied)}.{h}"


def tag_fields(lock: Lock, verdict: Verdict, inputs_digest: str = "") -> dict[str, str]:
    return {
        "model": lock.model,
        "date": _utc_date(verdict.finished),
        "atom7": lock.atom.sha[:7],
        "aiter7": lock.aiter.sha[:7],
        "patchset": patchset_id(lock),
        "inputs7": inputs_digest.removeprefix("sha256:")[:7],
    }


def _utc_date(stamp: str) -> str:
    try:
        when = _dt.datetime.fromisoformat(stamp)
    except ValueError:
        raise TagError(
            f"the smoke verdict's finish time {stamp!r} is not an ISO 8601 time.", hint=RERUN
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return when.astimezone(_dt.UTC).strftime("%Y%m%d")


def render_tag(template: str, fields: Mapping[str, str], *, setting: str) -> str:
    """Fill a tag template and validate the result against the registry tag grammar."""
    try:
        tag = template.format_map(dict(fields))
    except KeyError as e:
        raise ConfigError(
            f"[tag] {setting} = {template!r} uses an unknown field {{{e.args[0]}}}; "
            f"known fields: {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}."
        ) from None
    except (ValueError, IndexError) as e:
        raise ConfigError(f"[tag] {setting} = {template!r} is not a valid template: {e}.") from None
    problem = tag_problem(tag)
    if problem:
        raise UsageError(
            f"[tag] {setting} = {template!r} makes the tag '{tag}', which is not a valid registry tag: "
            f"{problem}.",
            hint="Change the template; a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. Nothing was pushed.",
        )
    return tag


def plan_tags(settings: Settings, fields: Mapping[str, str]) -> tuple[str, list[str]]:
    immutable = render_tag(settings.tag.tag_template, fields, setting="tag_template")
    moving: list[str] = []
    for tmpl in settings.tag.moving_tags:
        t = render_tag(tmpl, fields, setting="moving_tags")
        if t not in moving:
            moving.append(t)
    if settings.tag.push_latest and "latest" not in moving:
        moving.append("latest")
    if immutable in moving:
        raise ConfigError(
            f"the immutable tag '{immutable}' is also a moving tag; [tag] tag_template must make a tag "
            "that says what is inside (e.g. include {date}, {atom7}, {aiter7})."
        )
    return immutable, moving


def target_repository(settings: Settings, registry: str | None, repository: str | None) -> ImageRef:
    """`registry/repository` to push to (flags over settings)."""
    repo = repository or settings.image.repository
    reg = registry if registry is not None else settings.tag.registry
    if "@" in reg or "://" in reg:
        # not echoed: a value like user:password@host would put a secret on the console
        raise UsageError(
            "the registry to push to must be host[:port], without a scheme or credentials.",
            hint="Give credentials in PIPELINE_REGISTRY_USER / PIPELINE_REGISTRY_PASSWORD "
            "or the Docker config.",
        )
    name = f"{reg.rstrip('/')}/{repo}" if reg else repo
    ref = parse_image_ref(name)
    if ref.tag or ref.digest:
        raise UsageError(f"the repository to push to ({name}) must not carry a tag or digest.")
    return ref


# --------------------------------------------------------------------------- flow


@dataclass(frozen=True)
class TagResult:
    immutable_ref: str  # registry/repository:immutable-tag
    digest: str
    moved: list[str]  # moving tags now at `digest`
    record_path: Path
    pinned_ref: str = ""  # registry/repository@digest
    pushed: bool = True  # False when the immutable tag already held this image
    attested: bool = False
    state: str = "moved"  # how the moving tags ended: moved, finished (after a failure), yielded

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["record_path"] = str(self.record_path)
        return d


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tag_lock_path(cache_dir: Path, target: ImageRef) -> Path:
    key = hashlib.sha256(target.name.encode()).hexdigest()[:16]
    return cache_dir / "tag-locks" / f"{key}.lock"


def _manifest_image_id(body: bytes, media_type: str) -> str | None:
    """The config digest (= the engine's image ID) of a single-image manifest; None for an index."""
    if media_type not in (MEDIA_DOCKER_MANIFEST, MEDIA_OCI_MANIFEST):
        return None
    try:
        return str(json.loads(body)["config"]["digest"])
    except (ValueError, KeyError, TypeError):
        return None


def _holds_image(client: RegistryClient, target: ImageRef, digest: str, image_id: str) -> bool:
    if digest == image_id:  # containerd image store: the ID is the manifest digest
        return True
    body, media_type, _ = client.get_manifest(target.repository, digest)
    return _manifest_image_id(body, media_type) == image_id


def cosign_available() -> str | None:
    return shutil.which("cosign")


@dataclass(frozen=True)
class ReleasePlan:
    """What `pipeline tag` would push and move, checked against the verdict and the image."""

    verdict: VerdictFile
    binding: BoundVerdict  # the image, lock and recipe the verdict is bound to
    target: ImageRef
    immutable: str
    moving: list[str]
    digest: str  # the registry digest the verdict was made for: what is tagged

    @property
    def image(self) -> ImageInfo:
        return self.binding.image


class ReleaseRequest(TypedDict):
    """What `release_plan` and `tag_verified` are asked: the image, the verdict, lock and recipe it
    must be bound to, and where it goes (`registry`/`repository`, else the settings')."""

    image: str
    verdict_path: Path
    lock: Path | None
    recipe_path: Path | None
    settings: Settings
    registry: str | None
    repository: NotRequired[str | None]
    log: Logger


def release_plan(engine: EngineAPI, **request: Unpack[ReleaseRequest]) -> ReleasePlan:
    """The binding checked (verdict, image, recipe, lock) and the tags planned; nothing pushed."""
    unknown = request.keys() - ReleaseRequest.__required_keys__ - ReleaseRequest.__optional_keys__
    if unknown:  # as a keyword-only signature would
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(unknown))}")
    image, settings, log = request["image"], request["settings"], request["log"]
    verdict = read_tag_verdict(request["verdict_path"])
    info = engine.image(image)
    binding = check_binding(
        verdict,
        info,
        image=image,
        lock_path=request["lock"],
        recipe_path=request["recipe_path"],
        locks_dir=Path(settings.paths.locks_dir),
    )
    img = binding.image
    digest = bound_digest(verdict, image)
    log.detail(f"verdict {verdict.path} is bound to {image} ({_short(img.id)}, {digest}), recipe and lock")
    target = target_repository(settings, request["registry"], request.get("repository"))
    fields = tag_fields(binding.lock, verdict.verdict, verdict.verdict.inputs_digest)
    immutable, moving = plan_tags(settings, fields)
    log.detail(f"immutable tag {immutable}; moving tags {', '.join(moving) or '(none)'}")
    return ReleasePlan(verdict, binding, target, immutable, list(moving), digest)


def tag_verified(
    engine: EngineAPI,
    *,
    env: Mapping[str, str],
    client: RegistryClient | None = None,
    lock_timeout: float = 120.0,
    run_cosign: Callable[[Sequence[str], Mapping[str, str]], subprocess.CompletedProcess[str]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    allow_older: bool = False,
    build_attestations: Path | None = None,
    **request: Unpack[ReleaseRequest],
) -> TagResult:
    """Verify the binding, push the immutable tag, read its digest back, record, move the moving tags.

    Moving tags only move forward (`pipeline.release.moving_tags`); `allow_older` moves them back, loudly.
    """
    image, settings, log = request["image"], request["settings"], request["log"]
    started = _now()
    cosign = settings.tag.cosign
    if cosign and cosign_available() is None:
        raise TagError(
            "cosign attestation was asked for ([tag] cosign / --cosign) but `cosign` is not on PATH; "
            "nothing was pushed.",
            hint="Install cosign, or run without --cosign.",
        )
    planned = release_plan(engine, **request)
    verdict, binding, img, target = planned.verdict, planned.binding, planned.image, planned.target
    verdict_path = verdict.path
    immutable, moving = planned.immutable, planned.moving

    creds = credentials_for(target.registry, env)
    if creds is not None:
        log.mask(creds.password)
        log.detail(f"registry credentials: {creds}")
    if client is None:
        client = RegistryClient(
            target.registry,
            credentials=creds,
            on_retry=lambda m: log.warn(m),
            timeout=min(REQUEST_TIMEOUT, float(settings.tag.push_timeout_s)),
        )
    repo = target.repository

    lock_file = _tag_lock_path(settings.cache_dir, target)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    flock = acquire_lock(
        lock_file,
        wait=lock_timeout,
        busy=f"another `pipeline tag` is moving the tags of {target.name} (lock {lock_file}) and did not "
        f"finish within {lock_timeout:.0f} s.",
        hint="Wait for it to finish and run again; nothing was pushed.",
    )
    our_created = img.labels.get(labels.OCI_CREATED, "")
    tested = planned.digest
    local_ref = f"{target.name}:{immutable}"
    manifest: tuple[bytes, str] = (b"", "")  # the smoke-tested digest's manifest, read from the registry

    def push_immutable() -> str:
        """The immutable tag PUT as the smoke-tested digest's manifest (no layer, no name is pushed)."""
        log.detail(f"pushing {local_ref} → {tested}")
        body, media_type = manifest

        def put() -> str:
            return client.put_manifest(repo, immutable, body, media_type)

        return _push(put, f"{target.name}:{immutable}", log, sleep, settings.tag.push_timeout_s)

    rerun = _rerun_command(
        image, verdict_path, binding, target, "latest" in moving and "latest" not in settings.tag.moving_tags,
        allow_older,
    )  # fmt: skip
    mover = Mover(
        client, target.name, repo, "", our_created, allow_older, log, repair=lambda: None, rerun=rerun
    )
    record_dir = verdict_path.parent
    try:
        # 0. forward only: nothing is pushed when a moving tag already holds a newer release
        mover.preflight(moving)
        # the verdict's digest, in the target repository, must be this image
        manifest = _tested_manifest(client, target, tested, img.id)
        # 1. immutable tag: never moved once it exists; a manifest answering HTTP 500 is repaired
        existing, broken = current(client, repo, immutable)
        if broken:
            log.warn(f"the registry answers HTTP 500 for {local_ref}: pushing it again to repair it")
        if existing is not None:
            if not _holds_image(client, target, existing, img.id):
                raise TagError(
                    f"refusing to tag: {target.name}:{immutable} already exists and holds another image "
                    f"({existing}); an immutable tag is never moved.",
                    hint="Find out why the same inputs gave a different image, or change [tag] tag_template.",
                )
            digest, pushed = existing, False
            log.detail(f"{local_ref} already holds this image ({existing}); not pushed again")
        else:
            try:
                digest = push_immutable()
            except InfraError as e:  # the state, read back as after any failure: what the registry holds
                raise InfraError(
                    f"{sentence(e.message)} Read back: {_read_state(client, repo, [immutable, *moving])}.",
                    hint=e.hint,
                    evidence=e.evidence,
                ) from e
            pushed = True
            # 2. read it back from the registry API: that, not the push stream, is what we tag
            readback = client.manifest_digest(repo, immutable)
            if readback != digest:
                raise TagError(
                    f"the push of {local_ref} reported {digest} but the registry now serves "
                    f"{readback or 'nothing'} for it; the moving tags were not touched.",
                    hint="Check the registry (another writer?) and run `pipeline tag` again.",
                )
            if not _holds_image(client, target, digest, img.id):
                raise TagError(
                    f"the manifest pushed as {local_ref} ({digest}) is not image "
                    f"{_short(img.id)}; the moving tags were not touched.",
                    hint="Check the registry and run `pipeline tag` again.",
                )
        if tested != digest:
            raise TagError(
                f"refusing to move tags: the verdict was made for {target.name}@{tested} "
                f"but {immutable} is {digest} (foreign verdict); the moving tags were not touched.",
                hint=RERUN,
            )
        log.detail(f"{local_ref} → {digest}")

        def record(moved: Sequence[str], state: str, note: str, *, first: bool) -> tuple[Path, Path]:
            return write_record(
                record_dir,
                build_statement(
                    RecordInputs(
                        image_name=target.name,
                        digest=digest,
                        image_id=img.id,
                        immutable_tag=immutable,
                        moving_tags=list(moved),
                        moving_state=state,
                        moving_note=note,
                        lock=binding.lock,
                        lock_path=binding.lock_path,
                        recipe_name=verdict.verdict.recipe.name or binding.recipe_path.name,
                        recipe_path=binding.recipe_path,
                        recipe_sha256=verdict.verdict.recipe.sha256,
                        inputs_digest=verdict.verdict.inputs_digest,
                        verdict=verdict.verdict.to_json(),
                        verdict_path=verdict_path,
                        verdict_sha256=verdict.sha256,
                        started=started,
                        finished=_now(),
                        attestations=record_attestations(build_attestations, img.id),
                    )
                ),
                predicate_too=first,  # predicate.json stays what was attested
            )

        # 3. record (and attestation) before any moving tag points at the image: it says what is
        #    true then (verified, no moving tag moved yet) and is rewritten with what happened;
        #    an earlier attempt's record is kept, never replaced
        kept = keep_earlier_attempt(record_dir)
        if kept is not None:
            log.detail(f"the earlier attempt's record is kept in {kept}")
        record_path, predicate_path = record(
            [], "pending", "the moving tags are moved after this record", first=True
        )
        log.detail(f"verification record {record_path}")
        attested = False
        if cosign:
            _attest(target, digest, predicate_path, env, log, client.scheme, run_cosign)
            attested = True

        # 4. moving tags, by manifest PUT to the verified digest; the registry's state read back
        mover.digest = digest
        mover.repair = lambda: _repush(push_immutable, digest)
        outcome = mover.move(moving) if moving else MoveOutcome([], "moved", "no moving tags")
        record(outcome.moved, outcome.state, outcome.note, first=False)
        if outcome.error is not None:
            raise outcome.error
    finally:
        flock.release()
    return TagResult(
        immutable_ref=local_ref,
        digest=digest,
        moved=outcome.moved,
        record_path=record_path,
        pinned_ref=f"{target.name}@{digest}",
        pushed=pushed,
        attested=attested,
        state=outcome.state,
    )


def _rerun_command(
    image: str, verdict: Path, binding: BoundVerdict, target: ImageRef, latest: bool, allow_older: bool
) -> str:
    """The `pipeline tag` command that finishes this run's move (tagging is idempotent)."""
    argv = ["pipeline", "tag", "--image", image, "--verdict", str(verdict), "--lock", str(binding.lock_path)]
    argv += ["--recipe", str(binding.recipe_path), "--registry", target.registry]
    argv += ["--repository", target.repository]
    argv += ["--push-latest"] if latest else []
    argv += ["--allow-older"] if allow_older else []
    return shlex.join(argv)


def _tested_manifest(
    client: RegistryClient, target: ImageRef, tested: str, image_id: str
) -> tuple[bytes, str]:
    """The manifest of the smoke-tested digest in the target repository, which must be this image;
    refused before anything is pushed otherwise."""
    try:
        body, media_type, _ = client.get_manifest(target.repository, tested)
    except RegistryUnavailable as e:
        if e.status != 500:
            raise
        raise InfraError(
            f"the registry answers HTTP 500 for {target.name}@{tested}, the smoke-tested digest (a push "
            "killed halfway leaves its revision link empty); nothing was pushed or moved.",
            hint="Push the candidate to that repository again from the engine that holds it (`docker push "
            f"{target.name}:TAG`, or `pipeline build --resume RUN`): it rewrites the link. Then run "
            "`pipeline tag` again.",
        ) from None
    except RegistryAuthError:
        raise
    except RegistryError:  # not there
        body, media_type = b"", ""
    if not body or (tested != image_id and _manifest_image_id(body, media_type) != image_id):
        raise TagError(
            f"refusing to tag: the verdict was made for {target.name}@{tested}, which the registry does not "
            f"hold as image {_short(image_id)} (foreign verdict); nothing was pushed or moved.",
            hint=RERUN,
        )
    return body, media_type


def _repush(push: Callable[[], str], digest: str) -> None:
    got = push()
    if got != digest:
        raise TagError(f"pushing the immutable ref again gave {got}, not {digest}; nothing more was moved.")


PUSH_ATTEMPTS = 3
REQUEST_TIMEOUT = 30.0  # one registry API request, at most (less when [tag] push_timeout_s is smaller)


class PushTimeout(InfraError):
    """The immutable tag's PUT did not finish within [tag] push_timeout_s."""


def _push(
    put: Callable[[], str], what: str, log: Logger, sleep: Callable[[float], None], timeout: float
) -> str:
    """`put()` (the immutable tag's manifest PUT, its digest), with bounded retries (the one retry
    policy) when the registry is away, every attempt together within `timeout` seconds.

    A refusal (TagError: denied, bad credentials) is not retried; putting the same
    manifest again is harmless, so a transient failure is, while time is left.
    """
    deadline = time.monotonic() + timeout

    def warn(n: int, tries: int, wait: float, err: BaseException) -> None:
        text = err.message if isinstance(err, PipelineError) else str(err)
        log.warn(f"push of {what} failed ({text}); retrying in {wait:.0f}s")

    def attempt() -> str:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PushTimeout(f"the push of {what} did not finish within {timeout:.0f} s")
        return _bounded_push(put, what, left, timeout)

    try:
        return with_retries(
            attempt,
            retries=PUSH_ATTEMPTS - 1,
            transient=lambda e: isinstance(e, InfraError) and not isinstance(e, PushTimeout),
            backoff=1.0,
            on_retry=warn,
            sleep=sleep,
        )
    except PushTimeout as e:
        raise PushTimeout(
            f"{e.message} ([tag] push_timeout_s, PIPELINE_PUSH_TIMEOUT_S); gave up, the moving tags were "
            "not touched. The registry may still store that tag: the next `pipeline tag` finds it.",
            hint="Check the registry (stalled, overloaded, unreachable?) and run `pipeline tag` again; "
            "raise [tag] push_timeout_s for a slow link.",
        ) from None
    except GaveUp as gave_up:
        err = gave_up.error
        assert isinstance(err, InfraError)
        raise InfraError(
            f"{err.message} (gave up after {PUSH_ATTEMPTS} attempts; the moving tags were not touched)",
            hint=err.hint,
            evidence=err.evidence,
        ) from err


def _bounded_push(put: Callable[[], str], what: str, seconds: float, timeout: float) -> str:
    """One `put()`, given up after `seconds` (the client's retries have no deadline of their own)."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["digest"] = put()
        except BaseException as e:  # handed to the caller's thread below
            done["error"] = e

    worker = threading.Thread(target=run, name=f"push {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise PushTimeout(f"the push of {what} did not finish within {timeout:.0f} s")
    if "error" in done:
        raise done["error"]
    return str(done["digest"])


def _read_state(client: RegistryClient, repository: str, tags: Sequence[str]) -> str:
    """Where each tag points now, one request each (no retries: the registry just failed us)."""
    retries, client.retries = client.retries, 0
    try:
        return ", ".join(f"{t} → {current(client, repository, t)[0] or 'absent'}" for t in tags)
    except PipelineError as e:
        return f"unknown, the registry did not answer that either ({e.message})"
    finally:
        client.retries = retries


def _attest(
    target: ImageRef,
    digest: str,
    predicate: Path,
    env: Mapping[str, str],
    log: Logger,
    scheme: str,
    run: Callable[[Sequence[str], Mapping[str, str]], subprocess.CompletedProcess[str]] | None,
) -> None:
    cmd = ["cosign", "attest", "--yes", "--type", PREDICATE_TYPE, "--predicate", str(predicate)]
    if env.get("COSIGN_KEY"):
        cmd += ["--key", "env://COSIGN_KEY"]  # the key stays in the environment, never on the command line
    if scheme == "http" or default_scheme(target.registry) == "http":
        cmd += ["--allow-http-registry", "--allow-insecure-registry"]
    cmd.append(f"{target.name}@{digest}")
    log.detail("$ " + " ".join(cmd))
    runner = run or _run_cosign
    try:
        proc = runner(cmd, env)
    except OSError as e:
        raise TagError(f"could not run cosign: {e.strerror}; the moving tags were not touched.") from None
    if proc.returncode != 0:
        raise TagError(
            f"cosign attest for {target.name}@{digest} failed (exit {proc.returncode}); the moving tags "
            "were not touched.",
            hint="See the run log for cosign's output; fix the signing setup and run `pipeline tag` again.",
            evidence=log.redact((proc.stdout or "") + (proc.stderr or "")),
        )
    log.info(f"attested {target.name}@{digest} ({PREDICATE_TYPE})")


def _run_cosign(cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), env=dict(env), capture_output=True, text=True, timeout=600, check=False)
