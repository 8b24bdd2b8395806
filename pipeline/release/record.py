"""The verification record: what was tagged, and the evidence it was verified.

An in-toto Statement v1 (https://github.com/in-toto/attestation, spec v1):

    {
      "_type": "https://in-toto.io/Statement/v1",
      "subject": [{"name": "127.0.0.1:5000/rocm/atom-dev", "digest": {"sha256": "..."}}],
      "predicateType": "https://atom-image-pipeline.dev/verification/v1",
      "predicate": {image, tags, lock (the lock file as data), patches, recipe, smoke, attestations,
                    tool, times}
    }

`attestations` says what exists beside this record: `slsa_provenance` and `sbom` are null with
the reason (our front ends make none), and `build_provenance` links the build's own in-toto
statement of its inputs (pipeline.image.provenance) once its subject is checked to be this image.

Written atomically as `record.json` next to the verdict, twice: before any moving tag
moves (``moving_state: pending``, no moving tag; the predicate alone, `predicate.json`,
is what `cosign attest --predicate` takes then) and after, with what happened to the
moving tags, never what was planned. An earlier attempt's record and predicate are kept,
moved to `tag-attempts/<n>/` (1 the oldest) before a new attempt writes its own, so a
failed attempt never replaces a release's record. Nothing
from the environment goes in: no credentials, and URLs lose any user-info.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.errors import DiskError, disk_error
from pipeline.fsutil import atomic_write_json
from pipeline.image.provenance import record_attestations
from pipeline.lock import Lock

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://atom-image-pipeline.dev/verification/v1"
RECORD_NAME = "record.json"
PREDICATE_NAME = "predicate.json"
ATTEMPTS_DIR = "tag-attempts"

_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)


def strip_userinfo(text: str) -> str:
    """`https://user:token@host/x` -> `https://host/x` (tokens in clone URLs never reach a record)."""
    return _USERINFO.sub(r"\g<scheme>", text)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return strip_userinfo(value)
    if isinstance(value, Mapping):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


@dataclass(frozen=True)
class RecordInputs:
    """Everything the record states, gathered by the tag stage."""

    image_name: str  # registry/repository, no tag
    digest: str  # sha256:...
    image_id: str
    immutable_tag: str
    moving_tags: Sequence[str]  # the moving tags that point at the digest now (what happened)
    lock: Lock
    lock_path: Path
    recipe_name: str
    recipe_path: Path
    recipe_sha256: str
    inputs_digest: str
    verdict: Mapping[str, Any]  # the smoke verdict as written
    verdict_path: Path
    verdict_sha256: str
    started: str  # ISO 8601 UTC: when the tag stage started
    finished: str  # when the immutable push was verified
    moving_state: str = "moved"  # pending (before the moves), moved, finished, rolled back, yielded, unknown
    moving_note: str = ""  # one sentence: what happened to the moving tags
    # pipeline.image.provenance.record_attestations: SLSA/SBOM (none from our front ends, and why) and the
    # link to our own build provenance; None: not known to this tag run
    attestations: Mapping[str, Any] | None = None


def build_statement(inp: RecordInputs) -> dict[str, Any]:
    algo, _, hexdigest = inp.digest.partition(":")
    lock = inp.lock
    verdict = inp.verdict
    predicate: dict[str, Any] = {
        "image": {
            "name": inp.image_name,
            "digest": inp.digest,
            "id": inp.image_id,
            "immutable_tag": inp.immutable_tag,
            "moving_tags": list(inp.moving_tags),
            "moving_state": inp.moving_state,
            "moving_note": inp.moving_note,
            "inputs_digest": inp.inputs_digest,
        },
        "lock": {
            "path": str(inp.lock_path),
            "sha256": lock.digest(),
            "pair_digest": lock.pair_digest(),  # the image's label: the image serves every lock with it
            "data": lock.model_dump(mode="json"),
        },
        "sources": {
            "atom": {"url": lock.atom.url, "ref": lock.atom.ref, "sha": lock.atom.sha},
            "aiter": {"url": lock.aiter.url, "ref": lock.aiter.ref, "sha": lock.aiter.sha},
            "base_image": lock.base_image.pinned,
        },
        "patches": [{"name": p.name, "sha256": p.sha256, "status": p.status} for p in lock.patches],
        "recipe": {"name": inp.recipe_name, "path": str(inp.recipe_path), "sha256": inp.recipe_sha256},
        "smoke": {
            "verdict_path": str(inp.verdict_path),
            "verdict_sha256": inp.verdict_sha256,
            "status": verdict.get("status"),
            "passed": verdict.get("passed"),
            "reason": verdict.get("reason", ""),
            "checks": list(verdict.get("checks") or []),
            # who answered the probes: the container and the image it ran (proven by the smoke run)
            "server": verdict.get("server"),
            "started": verdict.get("started"),
            "finished": verdict.get("finished"),
            "tool_version": verdict.get("tool_version"),
        },
        "attestations": dict(inp.attestations or record_attestations(None, inp.image_id)),
        "tool": {"name": "atom-image-pipeline", "version": __version__},
        "times": {"tag_started": inp.started, "verified": inp.finished},
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": inp.image_name, "digest": {algo: hexdigest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": _scrub(predicate),
    }


def write_record(
    directory: Path, statement: Mapping[str, Any], *, predicate_too: bool = True
) -> tuple[Path, Path]:
    """Write `record.json` (the statement) and `predicate.json` atomically; their paths.

    `predicate_too=False` leaves `predicate.json` as it was (what was attested).
    """
    record = directory / RECORD_NAME
    predicate = directory / PREDICATE_NAME
    if predicate_too:
        atomic_write_json(predicate, statement["predicate"])
    atomic_write_json(record, statement)
    return record, predicate


def keep_earlier_attempt(directory: Path) -> Path | None:
    """Move an earlier attempt's `record.json` and `predicate.json` to `tag-attempts/<n>/`; where.

    None when there was none. DiskError (exit 14) when they cannot be moved: nothing is written then.
    """
    found = [p for p in (directory / RECORD_NAME, directory / PREDICATE_NAME) if p.exists()]
    if not found:
        return None
    try:
        n = (
            1 + sum(1 for _ in (directory / ATTEMPTS_DIR).glob("*"))
            if (directory / ATTEMPTS_DIR).is_dir()
            else 1
        )
        while True:
            aside = directory / ATTEMPTS_DIR / str(n)
            try:
                aside.mkdir(parents=True)
                break
            except FileExistsError:
                n += 1
        for p in found:
            p.rename(aside / p.name)
    except OSError as e:
        err = disk_error(e, "move aside") or DiskError(f"cannot keep the earlier record in {directory}: {e}.")
        raise err from None
    return aside
