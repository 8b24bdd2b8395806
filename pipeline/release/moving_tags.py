"""Moving tags (`<model>-verified`, `latest`): forward only, never split, state read back.

The registry is the arbiter, so this holds across machines (a file lock covers one):

- **Forward only.** A release is ordered by its image's `org.opencontainers.image.created`
  label, which render sets to the newer of the lock's two commit dates (or SOURCE_DATE_EPOCH).
  Before anything is pushed, each moving tag's current manifest and config are read from the
  registry; if one holds a newer release the run refuses (exit 10) unless `--allow-older`,
  which moves back and says so loudly. An image without the label cannot be ordered: it is
  moved over, with a warning.
- **Conditional re-read.** Just before each manifest PUT the tag is read again; if it changed
  since the decision, the decision is made again against what it holds now.
- **Read back.** After the moves every tag is read again. After any failure the state of all
  moving tags is read back (waiting for the registry to return, bounded), then either finished
  (every tag at the new digest) or rolled back (every tag where it was; one that did not exist
  is deleted), and the outcome says which. Where the registry will not delete a tag alone
  (distribution 2.x), the outcome is **split**, said plainly, with the command that repairs it.
  A manifest the registry answers HTTP 500 for (a revision link left empty by a push killed
  halfway) is repaired by pushing the immutable ref again, which rewrites it.

What remains racy: the v2 API has no compare-and-swap on a tag. Between our re-read and our
PUT another machine can PUT an older or newer manifest; the read-back after the moves catches
a newer one that landed before it (our moved tags then yield to that newer release) but not a
PUT that lands after our read-back. Run concurrent releases of one repository from one
scheduler, or accept that the last writer's read-back decides.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pipeline import labels
from pipeline.errors import InfraError, PipelineError, TagError, sentence
from pipeline.log import Logger
from pipeline.oci.registry import RegistryClient, RegistryError, RegistryUnavailable
from pipeline.retry import GaveUp, with_retries

MoveState = Literal["moved", "finished", "rolled back", "split", "yielded", "unknown", "not moved"]
READBACK_RETRIES = 4  # after a failure: about 15 s of waiting for the registry to come back


class NewerRelease(TagError):
    """A moving tag holds a newer release than the one being tagged."""


@dataclass
class MoveOutcome:
    moved: list[str]  # tags that now point at the digest
    state: MoveState
    note: str = ""  # one sentence for the user and the record
    error: PipelineError | None = None
    left: dict[str, str | None] = field(default_factory=dict)  # tags not at the digest -> where they are


def _parse(stamp: str) -> _dt.datetime | None:
    try:
        when = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)


def created_of(client: RegistryClient, repository: str, digest: str) -> str:
    """The `created` label of the image a manifest points at ("" when it has none / is an index)."""
    body, _media, _ = client.get_manifest(repository, digest)
    try:
        config_digest = str(json.loads(body)["config"]["digest"])
    except (ValueError, KeyError, TypeError):
        return ""
    try:
        config = json.loads(client.get_blob(repository, config_digest))
    except (ValueError, RegistryError):  # no readable config: the release cannot be ordered
        return ""
    found = ((config.get("config") or {}).get("Labels") or {}).get(labels.OCI_CREATED, "")
    return str(found)


def current(client: RegistryClient, repository: str, tag: str) -> tuple[str | None, bool]:
    """(digest or None, broken): broken when the registry answers HTTP 500 for this tag."""
    try:
        return client.manifest_digest(repository, tag), False
    except RegistryUnavailable as e:
        if e.status == 500:
            return None, True
        raise


@dataclass
class Mover:
    client: RegistryClient
    name: str  # registry/repository, for messages
    repository: str
    digest: str
    created: str  # the `created` label of the image being tagged
    allow_older: bool
    log: Logger
    repair: Callable[[], None]  # push the immutable ref again (fixes a broken revision link)
    rerun: str = ""  # the `pipeline tag` command that finishes the move (said when tags are split)
    tags: list[str] = field(default_factory=list)  # the moving tags of this run

    # ------------------------------------------------------------------ forward only

    def check_forward(self, tag: str, now: str | None) -> None:
        """Refuse (NewerRelease) when `tag` holds a newer release, unless allowed, said loudly."""
        if now is None or now == self.digest:
            return
        theirs = created_of(self.client, self.repository, now)
        ours_t, theirs_t = _parse(self.created), _parse(theirs)
        if ours_t is None or theirs_t is None:
            self.log.warn(
                f"{self.name}:{tag} holds {now[:19]} (created {theirs or 'unknown'}); this image's created "
                f"label is {self.created or 'missing'}: cannot tell which is newer, moving it."
            )
            return
        if ours_t >= theirs_t:
            return
        if self.allow_older:
            self.log.warn(
                f"MOVING BACK: {self.name}:{tag} holds a newer release ({now[:19]}, created {theirs}); "
                f"--allow-older moves it back to {self.digest[:19]} (created {self.created})."
            )
            return
        raise NewerRelease(
            f"refusing to move {self.name}:{tag} backwards: it holds a newer release ({now}, created "
            f"{theirs}) than this image ({self.digest if self.digest else 'not pushed yet'}, created "
            f"{self.created}).",
            hint="Moving tags only move forward. Pass --allow-older to move them back on purpose.",
        )

    def preflight(self, tags: Sequence[str]) -> None:
        """Before anything is pushed: every moving tag may move to us."""
        for tag in tags:
            now, broken = current(self.client, self.repository, tag)
            if not broken:
                self.check_forward(tag, now)

    # ------------------------------------------------------------------ moving

    def move(self, tags: Sequence[str]) -> MoveOutcome:
        self.tags = list(tags)
        body, media_type, got = self.client.get_manifest(self.repository, self.digest)
        if got != self.digest:
            err = TagError(
                f"asked the registry for {self.digest} and got {got}; the moving tags were not touched."
            )
            return MoveOutcome([], "not moved", "no moving tag was touched", err)
        previous: dict[str, str | None] = {}
        moved: list[str] = []
        tag = ""
        try:
            for tag in tags:
                self._move_one(tag, body, media_type, previous)
                moved.append(tag)
        except NewerRelease as err:  # another machine released a newer image meanwhile
            return self._rollback(moved, previous, err, f"a newer release appeared on '{tag}'")
        except PipelineError as err:
            return self.recover(tags, previous, err, tag)
        return self._read_back(tags, previous)

    def _move_one(self, tag: str, body: bytes, media_type: str, previous: dict[str, str | None]) -> None:
        for _ in range(3):
            now, broken = current(self.client, self.repository, tag)
            if now == self.digest:
                self.log.detail(f"{self.name}:{tag} already at {self.digest}")
                return
            if not broken:
                self.check_forward(tag, now)
            again, _ = current(self.client, self.repository, tag)  # conditional re-read just before the PUT
            if again != now:
                continue  # it moved meanwhile: decide again against what it holds now
            previous.setdefault(tag, now)
            self.client.put_manifest(self.repository, tag, body, media_type)
            self.log.detail(f"{self.name}:{tag} → {self.digest} (was {now or 'absent'})")
            return
        raise TagError(
            f"{self.name}:{tag} kept changing while we tried to move it; another writer is at work."
        )

    def _read_back(self, tags: Sequence[str], previous: dict[str, str | None]) -> MoveOutcome:
        left: dict[str, str | None] = {}
        for tag in tags:
            now, _ = current(self.client, self.repository, tag)
            if now != self.digest:
                left[tag] = now
        if not left:
            return MoveOutcome(list(tags), "moved", f"every moving tag points at {self.digest}")
        # someone else moved a tag after us: a newer release wins everywhere, never a split
        newer = next((d for d in left.values() if d is not None), None)
        if newer is not None:
            try:
                self.check_forward("(read back)", newer)
            except NewerRelease:
                for tag in tags:
                    if tag not in left:
                        self.client.tag_digest(self.repository, newer, tag)
                note = (
                    f"a newer release ({newer[:19]}) was tagged meanwhile; every moving tag now points at it"
                )
                self.log.warn(note)
                return MoveOutcome([], "yielded", note, left={t: newer for t in tags})
        moved = [t for t in tags if t not in left]
        where = ", ".join(f"{t} → {d or 'absent'}" for t, d in left.items())
        err = TagError(
            f"after moving, {where} in {self.name}: another writer moved them back.",
            hint="Run `pipeline tag` again; it moves forward only.",
        )
        return MoveOutcome(moved, "moved", "moved, but another writer changed some tags after us", err, left)

    # ------------------------------------------------------------------ after a failure

    def state(self, tags: Sequence[str]) -> dict[str, tuple[str | None, bool]]:
        """Every moving tag's digest (and whether broken), waiting a bounded time for the registry."""

        def read() -> dict[str, tuple[str | None, bool]]:
            return {t: current(self.client, self.repository, t) for t in tags}

        return with_retries(
            read,
            retries=READBACK_RETRIES,
            transient=lambda e: isinstance(e, InfraError),
            backoff=1.0,
            sleep=self.client.sleep,
        )

    def recover(
        self, tags: Sequence[str], previous: dict[str, str | None], err: PipelineError, at: str
    ) -> MoveOutcome:
        """Read the registry back, then finish the move or roll it back: one consistent state."""
        self.log.warn(f"moving {self.name}:{at} failed ({err.message}); reading the registry's state back")
        try:
            state = self.state(tags)
            if any(broken for _, broken in state.values()):
                self.log.warn(f"the registry answers HTTP 500 for a tag of {self.name}: pushing it again")
                self.repair()
                state = self.state(tags)
        except (GaveUp, PipelineError) as gone:
            why = gone.error if isinstance(gone, GaveUp) else gone
            note = f"the registry did not answer after the failure ({why}); the moving tags' state is unknown"
            return MoveOutcome(
                [], "unknown", note,
                InfraError(
                    f"moving the tags of {self.name} to {self.digest} failed at '{at}': "
                    f"{sentence(err.message)} Then {note}. The immutable tag and the record are in place.",
                    hint="Run `pipeline tag` again once the registry is healthy: it reads the tags and "
                    "finishes the move.",
                    evidence=err.evidence,
                ),
            )  # fmt: skip
        try:  # finish: forward is where a verified release goes
            body, media_type, _ = self.client.get_manifest(self.repository, self.digest)
            for tag in tags:
                if state[tag][0] != self.digest:
                    self._move_one(tag, body, media_type, previous)
            done = self._read_back(tags, previous)
        except PipelineError as again:
            return self._rollback(
                [t for t in tags if t in previous], previous, again, f"finishing after '{at}' failed too"
            )
        if done.error is None and done.state == "moved":
            done.state = "finished"
            done.note = (
                f"a PUT failed ({err.message}); read back and finished: every moving tag at {self.digest}"
            )
            self.log.warn(done.note)
        return done

    def _rollback(
        self, moved: Sequence[str], previous: dict[str, str | None], err: PipelineError, why: str
    ) -> MoveOutcome:
        """Put every tag we moved back where it was; a tag that did not exist before is deleted.

        Where the registry will not delete a tag (distribution 2.x cannot delete a tag alone), or a
        restore fails, the tags are split: said so in the outcome, with the command that repairs it.
        """
        restored: list[str] = []
        removed: list[str] = []
        left: dict[str, str | None] = {}
        problems: list[str] = []
        for tag in moved:
            before = previous.get(tag)
            try:
                now, _ = current(self.client, self.repository, tag)
            except PipelineError:
                now = self.digest  # cannot tell: try to restore it
            if now != self.digest:
                continue  # our PUT never landed (or someone moved it since): nothing of ours to undo
            try:
                if before is None:
                    refused = self.client.delete_tag(self.repository, tag)
                    if refused is None and current(self.client, self.repository, tag)[0] is None:
                        removed.append(tag)
                        continue
                    problems.append(f"the registry would not delete {tag} ({refused or 'it is still there'})")
                else:
                    self.client.tag_digest(self.repository, before, tag)
                    restored.append(tag)
                    continue
            except PipelineError as e:
                problems.append(f"could not put {tag} back: {e.message}")
            left[tag] = self.digest
        undone = [f"{t} restored" for t in restored] + [
            f"{t} deleted (it did not exist before)" for t in removed
        ]
        note = f"{why}; rolled back: {', '.join(undone) or 'nothing of ours to undo'}"
        state: MoveState = "rolled back"
        hint = (
            _without_claims(err.hint)
            or "Run `pipeline tag` again once the registry is healthy; it is idempotent."
        )
        if left:
            state = "split"
            elsewhere = [t for t in self.tags or previous if t not in left]
            note += (
                f"; SPLIT: {', '.join(left)} still point(s) at {self.digest}"
                + (f" while {', '.join(elsewhere)} do not" if elsewhere else "")
                + f" ({'; '.join(problems)})"
            )
            hint = (
                "Repair it: fix the cause above, then run "
                + (f"`{self.rerun}`" if self.rerun else "the same `pipeline tag` command")
                + " again, which moves every moving tag to this verified image; or delete "
                + ", ".join(left)
                + " in the registry by hand."
            )
            self.log.warn(note)
        cls = InfraError if isinstance(err, InfraError) else TagError  # the exit code; not its own fields
        return MoveOutcome(
            list(left), state, note,
            cls(
                f"moving the tags of {self.name} to {self.digest} failed: {err.message} {note[0].upper()}"
                f"{note[1:]}. The immutable tag and the record are in place.",
                hint=hint,
                evidence=err.evidence,
            ),
            left,
        )  # fmt: skip


def _without_claims(hint: str | None) -> str:
    """A registry error's hint, less its claim that nothing was moved (here, something may have been)."""
    return (hint or "").replace("; nothing was moved.", ".").replace(" Nothing was moved.", "")
