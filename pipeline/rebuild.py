"""`pipeline rebuild`: what a scheduled CI job calls.

For each recipe: pin the configured refs (normally branch heads), run the
chain up to render, and compare the inputs digest with the one last released
for that model (`locks/<model>.released.json`, written after a successful tag).
Unchanged → nothing to do. Changed → build, smoke and tag in the same run.
If aiter's head breaks ATOM's head and the patch series does not fix it, fall
back to the newest compatible aiter (`pin --auto`'s search) and report the
break. Patches that became obsolete upstream are reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.config import Settings
from pipeline.errors import ExitCode, IncompatibleError, PipelineError, UsageError
from pipeline.fsutil import atomic_write_json, read_text
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.orchestrate import BuildRequest, RunResult, execute
from pipeline.stages import build, check, pin, render, smoke, tag
from pipeline.stages.tag import released_state_path

Outcome = Literal["released", "unchanged", "stopped", "failed"]


@dataclass
class ModelOutcome:
    model: str
    status: Outcome
    exit_code: int
    run_dir: str = ""
    atom: str = ""
    aiter: str = ""
    image: str = ""
    tag: str = ""
    notes: list[str] = field(default_factory=list)
    verdict: str = ""  # the check as it gates this model (reach-filtered)
    smoke: str = ""  # passed / failed / not run here / skipped
    drift: str = ""  # what changed upstream in the recipe's source since it was imported


def _read_released(settings: Settings, model: str) -> dict[str, Any]:
    p = released_state_path(Path(settings.paths.locks_dir), model)
    if not p.is_file():
        return {}
    text = read_text(p, what="release record")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f"release record {p} is not valid JSON: {e}.", hint="Delete it: the next release rewrites it."
        ) from None
    return data if isinstance(data, dict) else {}


def released_in_registry(
    settings: Settings, model: str, inputs_digest: str, env: Mapping[str, str], *, session: Any = None
) -> tuple[bool | None, str]:
    """Whether the model's moving tag in the target registry (`[tag] moving_tags`, e.g.
    `{model}-verified`) holds an image of this inputs digest (its label): what is tagged there IS
    released, whatever runner asks. (None, why) when the registry cannot say: none configured,
    offline, no moving tag of the model alone, or no answer; the caller falls back to the locks."""
    import string

    from pipeline import labels
    from pipeline.oci.registry import RegistryClient, credentials_for
    from pipeline.release.tag import target_repository

    if settings.sources.offline or not settings.tag.registry:
        return None, ""
    tags = [
        t.format(model=model)
        for t in settings.tag.moving_tags
        if {f for _, f, _, _ in string.Formatter().parse(t) if f is not None} <= {"model"}
    ]
    if not tags:
        return None, ""
    where = f"the registry's {tags[0]}"
    try:
        target = target_repository(settings, None, None)
        client = RegistryClient(
            target.registry, credentials=credentials_for(target.registry, env), retries=1, session=session
        )
        where = f"{target.registry}/{target.repository}:{tags[0]}"
        digest = client.manifest_digest(target.repository, tags[0])
        if digest is None:
            return False, f"{where} does not exist"
        body, _media, _ = client.get_manifest(target.repository, digest)
        manifest = json.loads(body)
        for entry in manifest.get("manifests", []):  # an index: the image, not its attestations
            if (entry.get("platform") or {}).get("os", "unknown") != "unknown":
                body, _media, _ = client.get_manifest(target.repository, entry["digest"])
                manifest = json.loads(body)
                break
        config = json.loads(client.get_blob(target.repository, manifest["config"]["digest"]))
        found = ((config.get("config") or {}).get("Labels") or {}).get(labels.INPUTS_DIGEST, "")
    except PipelineError as e:
        return None, f"{model}: the registry could not say what is released ({e.message.splitlines()[0]})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, f"the image at {where} has no readable config: not counted as released"
    if found == inputs_digest:
        return True, f"{where} holds inputs digest {inputs_digest[:12]}"
    return False, f"{where} holds inputs digest {str(found)[:12] or '(none)'}"


def obsolete_patches(settings: Settings, run_dir: Path) -> list[str]:
    """Patches the run's ATOM no longer needs: already upstream, or ATOM is past their range.

    (A patch that is only "not needed" for this aiter is not obsolete: another aiter may need it.)
    """
    from pipeline.patchq import PatchSeries, check_series
    from pipeline.sources import mirrors_for_lock

    lock = Lock.load(run_dir / "lock.toml")
    atom, aiter = mirrors_for_lock(settings, lock)
    notes = []
    for c in check_series(
        PatchSeries.load(Path(settings.paths.patches_dir)), atom, lock.atom.sha, aiter, lock.aiter.sha
    ):
        end = c.patch.atom_range.end
        end_sha = atom.rev_parse(end) if end else None
        past = end_sha is not None and atom.is_ancestor(end_sha, lock.atom.sha)
        if c.status == "already-upstream" or (c.status == "not-needed" and past):
            notes.append(f"patch {c.patch.name} is obsolete ({c.reason}): drop it from the series")
    return notes


def draft_note(settings: Settings, lock: Lock) -> str:
    """For a model blocked by a break at the lock's pair: whether the series holds a draft fix
    (`pipeline patch draft`) that applies there, and what it still needs from a person."""
    from pipeline.patchq import PatchSeries, check_series
    from pipeline.patchq.draft import is_draft, placeholders_in
    from pipeline.sources import mirrors_for_lock

    directory = Path(settings.paths.patches_dir)
    series = PatchSeries.load(directory) if (directory / "series").is_file() else PatchSeries(directory)
    make = f"`pipeline patch draft --model {lock.model}` drafts the mechanical fixes"
    if not any(is_draft(p) for p in series):
        return f"no draft fix in the series: {make}"
    atom, aiter = mirrors_for_lock(settings, lock)
    found = []
    for c in check_series(series, atom, lock.atom.sha, aiter, lock.aiter.sha):
        if is_draft(c.patch) and c.status == "applies":
            todo = placeholders_in(c.patch)
            found.append(f"{c.patch.name}" + (f" ({len(todo)} placeholder(s) to fill)" if todo else ""))
    if not found:
        return f"no draft fix in the series applies to this pair: {make}"
    return f"draft fix in the series, not reviewed yet: {', '.join(found)}"


@dataclass
class SharedPins:
    """One pin per ATOM x aiter pair: the first model resolves the refs, the others reuse the SHAs
    (the check of a pair is cached by its SHAs, so it runs once too; reachability is per model)."""

    atom: str | None = None
    aiter: str | None = None

    def remember(self, run_dir: Path) -> None:
        if self.atom is None and (run_dir / "lock.toml").is_file():
            lock = Lock.load(run_dir / "lock.toml")
            self.atom, self.aiter = lock.atom.sha, lock.aiter.sha


def _verdict(checked: check.Outputs | None) -> str:
    if checked is None:
        return ""
    where = f" off {checked.architecture}'s path" if checked.architecture else ""
    excused = [f"{checked.off_path} break(s){where}, warned"] if checked.off_path else []
    if checked.waived:  # the check's own count (compat.report.Counts), as its report prints it
        excused.append(f"{checked.waived} waived by the recipe")
    return "compatible" + (f" ({'; '.join(excused)})" if excused else "")


def _smoke(resumed_error: PipelineError | None, smoked: smoke.Outputs | None) -> str:
    if resumed_error is None:
        return "passed" if smoked is not None else ""
    code = resumed_error.exit_code
    if code == ExitCode.NO_HARDWARE:
        return "not run here (no MI355)"
    if code == ExitCode.SMOKE_FAILED:
        return "failed"
    return f"not reached (exit {int(code)})"


def recipe_drift(settings: Settings, model: str, atom_sha: str) -> str:
    """The upstream drift of the model's recipe source up to the pinned ATOM, in one line."""
    from pipeline.recipes.drift import drift_one
    from pipeline.recipes.recipe import find_recipe, load_recipe
    from pipeline.sources import open_mirror

    try:
        recipe = load_recipe(find_recipe(model, Path(settings.paths.recipes_dir)))
        atom = open_mirror(settings, settings.sources.atom_repo, fetch=False)
        return drift_one(atom, recipe.name, recipe.source, atom_sha).summary()
    except PipelineError as e:
        return f"not computed: {e.message}"


# -- one pin and one check for every model of a scheduled rebuild (the workflow's first job) --

PLAN_SCHEMA = "atom-image-pipeline/rebuild-plan/v2"
PLAN_FILE = "plan.json"
CANDIDATE_FILE = "candidate.json"
# A smoke test's expected length: the recorded durations of the benchmark rows it runs by default
# plus the server's start, the chat and GSM8K checks; a recipe that records none counts this long.
SMOKE_FIXED_S = 15 * 60.0
SMOKE_UNKNOWN_S = 30 * 60.0


def expected_smoke_s(model: str, recipes_dir: Path) -> float:
    """How long the model's smoke test is expected to run (what the plan orders GPU jobs by)."""
    from pipeline.recipes.recipe import BenchmarkCheck, find_recipe, load_recipe

    try:
        recipe = load_recipe(find_recipe(model, recipes_dir))
    except PipelineError:
        return SMOKE_UNKNOWN_S
    rows = [
        r
        for check in recipe.checks
        if isinstance(check, BenchmarkCheck)
        for r in check.reference
        if r.concurrency in check.concurrencies
    ]
    durations = [r.duration_s for r in rows if r.duration_s is not None]
    if rows and len(durations) == len(rows):
        return SMOKE_FIXED_S + sum(durations)
    return SMOKE_UNKNOWN_S


@dataclass
class Plan:
    """The ATOM x aiter pair every model of one rebuild builds, with each model's lock and check,
    its rendered inputs digest and aiter stage key: what the workflow's matrices are made of."""

    atom: str
    aiter: str
    models: dict[str, dict[str, Any]]  # model -> status, exit_code, lock (relative), verdict, notes,
    # inputs_digest, aiter_stage, released (that digest is already released: nothing to build)
    notes: list[str] = field(default_factory=list)
    root: Path = Path(".")
    gpu_hosts: int = 1  # how many smoke jobs run at once: the first follow builds make that many images

    def smoke_s(self, model: str) -> float:
        """The model's expected smoke length (recorded by the plan; unknown: SMOKE_UNKNOWN_S)."""
        return float(self.models.get(model, {}).get("smoke_s") or SMOKE_UNKNOWN_S)

    def longest_first(self, models: list[str]) -> list[str]:
        """Longest expected smoke first (LPT: GitHub starts a matrix's jobs in its order, so the
        longest runs do not end up last on a GPU host), ties by name."""
        return sorted(models, key=lambda m: (-self.smoke_s(m), m))

    def builds(self) -> list[dict[str, Any]]:
        """One build per distinct inputs digest to build: {inputs_digest, aiter_stage, models, lead}.

        `lead` is the first build of each aiter stage key: it compiles aiter and pushes that stage
        to the registry cache; the others start once it has (`needs:` in the workflow), from it.
        The builds whose models have the most smoke to run come first, so the lead of each aiter
        stage is the one whose smoke tests keep the GPU hosts busiest while the others build.
        """
        by_digest: dict[str, list[str]] = {}
        for model, e in sorted(self.models.items()):
            if e["status"] == "ok" and e.get("inputs_digest") and not e.get("released"):
                by_digest.setdefault(e["inputs_digest"], []).append(model)
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        order = sorted(by_digest.items(), key=lambda kv: (-sum(self.smoke_s(m) for m in kv[1]), kv[1][0]))
        for digest, models in order:
            key = self.models[models[0]].get("aiter_stage", "")
            out.append(
                {"inputs_digest": digest, "aiter_stage": key, "models": models, "lead": key not in seen}
            )
            seen.add(key)
        return out

    def matrix(self) -> dict[str, Any]:
        """What the workflow's jobs fan out over (all JSON lists; an empty one skips its job)."""
        builds = self.builds()
        built = [m for b in builds for m in b["models"]]
        follows = [b for b in builds if not b["lead"]]
        # GitHub starts a job when every job it needs is done, so the smoke tests run in three
        # waves: the lead builds' models when the leads are done; the models of the first follow
        # builds (as many as there are GPU hosts) when those are; the others after the rest.
        first, rest = follows[: max(0, self.gpu_hosts)], follows[max(0, self.gpu_hosts) :]

        def smoke(wave: list[dict[str, Any]]) -> list[str]:
            return self.longest_first([m for b in wave for m in b["models"]])

        return {
            "lead": [b["inputs_digest"] for b in builds if b["lead"]],
            "follow": [b["inputs_digest"] for b in follows],  # follow_first and follow_rest
            "follow_first": [b["inputs_digest"] for b in first],
            "follow_rest": [b["inputs_digest"] for b in rest],
            "smoke": self.longest_first(built),  # every model to smoke: the three waves
            "smoke_lead": smoke([b for b in builds if b["lead"]]),
            "smoke_first": smoke(first),
            "smoke_rest": smoke(rest),
            "left_out": sorted(m for m, e in self.models.items() if e["status"] != "ok"),
            "released": sorted(
                m for m, e in self.models.items() if e["status"] == "ok" and e.get("released")
            ),
        }

    def build_of(self, digest: str) -> dict[str, Any]:
        found = [b for b in self.builds() if b["inputs_digest"] == digest]
        if not found:
            listed = ", ".join(b["inputs_digest"][:12] for b in self.builds()) or "none"
            raise UsageError(
                f"the rebuild plan has no build with inputs digest {digest[:64]!r} (it has: {listed}).",
                hint="Pass one of the plan's `lead` or `follow` digests (plan.json, `matrix`).",
            )
        return found[0]

    @classmethod
    def load(cls, path: Path) -> Plan:
        text = read_text(path, what="rebuild plan")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"rebuild plan {path} is not valid JSON: {e}.") from None
        if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
            raise UsageError(
                f"{path} is not a rebuild plan ({PLAN_SCHEMA}).",
                hint="Write it with `pipeline rebuild --write-plan DIR` (the workflow's plan job does).",
            )
        try:
            return cls(
                data["atom"],
                data["aiter"],
                data["models"],
                list(data.get("notes", [])),
                path.parent,
                int(data.get("gpu_hosts", 1)),
            )
        except KeyError as e:
            raise UsageError(
                f"rebuild plan {path} lacks {e}.", hint="Write it again with --write-plan."
            ) from None
        except (TypeError, ValueError):
            raise UsageError(
                f"rebuild plan {path} has a gpu_hosts that is not a number of hosts.",
                hint="Write it again with --write-plan.",
            ) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "atom": self.atom,
            "aiter": self.aiter,
            "models": self.models,
            "notes": self.notes,
            "gpu_hosts": self.gpu_hosts,
            "builds": self.builds(),
            "matrix": self.matrix(),
        }

    def request(self, model: str, registry: str | None) -> BuildRequest:
        """A model job's run: exactly the planned lock (no re-pinning, no fallback of its own)."""
        entry = self.models.get(model)
        if entry is None:
            listed = ", ".join(sorted(self.models))
            raise UsageError(f"model {model!r} is not in the rebuild plan ({listed}).")
        if entry["status"] != "ok":
            raise IncompatibleError(
                f"{model}: the rebuild plan for ATOM {self.atom[:9]} x aiter {self.aiter[:10]} says "
                f"{entry['status']}: " + "; ".join(entry.get("notes", [])),
            )
        return BuildRequest(model=model, lock=self.root / entry["lock"], until="render", registry=registry)


def _check_at(
    model: str, atom: str | None, aiter: str | None, settings: Settings, log: Logger, env: Mapping[str, str]
) -> tuple[Any, Lock | None]:
    req = BuildRequest(model=model, atom_ref=atom, aiter_ref=aiter, until="check")
    result = execute(req, settings, log, env)
    lock_file = result.run_dir / "lock.toml"
    return result, (Lock.load(lock_file) if lock_file.is_file() else None)


def plan_rebuild(
    models: list[str],
    settings: Settings,
    log: Logger,
    env: Mapping[str, str],
    out_dir: Path,
    *,
    gpu_hosts: int = 1,
) -> Plan:
    """Pin the configured refs once, check every model's path at that pair, and write the locks
    and reports every model job builds from. When aiter's head breaks some model's path, the
    pair falls back once, for all models, to the oldest of their newest compatible aiters."""
    import shutil

    def round_at(atom: str | None, aiter: str | None) -> dict[str, tuple[Any, Lock | None, str | None]]:
        got: dict[str, tuple[Any, Lock | None, str | None]] = {}
        for model in models:
            try:
                result, lock = _check_at(model, atom, aiter, settings, log, env)
            except PipelineError as e:
                got[model] = (None, None, str(e))
                continue
            if lock is not None and atom is None:
                atom, aiter = lock.atom.sha, lock.aiter.sha  # the first model resolves the refs
            got[model] = (result, lock, None)
        return got

    first = round_at(None, None)
    locks = [lock for _, lock, _ in first.values() if lock is not None]
    if not locks:
        raise PipelineError(
            "no model of the rebuild could be pinned: "
            + "; ".join(f"{m}: {err}" for m, (_, _, err) in first.items() if err)
        )
    atom, aiter = locks[0].atom.sha, locks[0].aiter.sha
    notes: list[str] = []
    broken = [m for m, (r, _, _) in first.items() if r is not None and isinstance(r.error, IncompatibleError)]
    rounds = first
    if broken:
        candidates: list[Lock] = []
        for model in broken:
            auto = execute(
                BuildRequest(model=model, atom_ref=atom, until="check", auto_aiter=True), settings, log, env
            )
            pinned = auto.output("pin", pin.Outputs)
            newest = pinned.auto.newest_compatible if pinned is not None and pinned.auto is not None else None
            if pinned is not None and pinned.auto is not None and newest is not None:
                brk = pinned.auto.first_breaking
                said = f"aiter {aiter[:10]} breaks ATOM {atom[:9]} on {model}'s path" + (
                    f" (first breaking aiter commit {brk.sha[:10]}, {brk.subject!r})" if brk else ""
                )
                if auto.error is None:
                    candidates.append(pinned.lock)
                    notes.append(f"{said}; its newest compatible aiter is {newest.sha[:10]}")
                else:
                    # The search's newest aiter fixes every break a pin can fix, but the model's own
                    # check there still fails (a call that binds at no aiter): no pair serves it, and
                    # falling back for it would move every other model off the head for nothing.
                    why = auto.error.message.splitlines()[0]
                    notes.append(
                        f"{said}; no fallback: at aiter {newest.sha[:10]}, the newest without a break "
                        f"another pin fixes, its check still fails ({why})"
                    )
                if (at_head := first[model][1]) is not None:
                    notes.append(f"{model}: {draft_note(settings, at_head)}")
            else:
                why = auto.error.message.splitlines()[0] if auto.error is not None else "none found"
                notes.append(
                    f"aiter {aiter[:10]} breaks ATOM {atom[:9]} on {model}'s path; no fallback: {why}"
                )
        if candidates:
            oldest = min(candidates, key=lambda lock: lock.aiter.date)
            aiter = oldest.aiter.sha
            notes.append(f"every model builds aiter {aiter[:10]} (the oldest of those), one pair for all")
            rounds = round_at(atom, aiter)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {}
    recipes = Path(settings.paths.recipes_dir)
    for model, (result, lock, err) in rounds.items():
        entry: dict[str, Any] = {"status": "ok", "exit_code": 0, "lock": "", "verdict": "", "notes": []}
        entry["smoke_s"] = expected_smoke_s(model, recipes)
        if err is not None or result is None:
            entry.update(status="failed", exit_code=int(ExitCode.USAGE), notes=[err or "not run"])
        elif result.error is not None:
            entry.update(status="incompatible" if isinstance(result.error, IncompatibleError) else "failed")
            entry.update(exit_code=int(result.error.exit_code), notes=[result.error.message.splitlines()[0]])
            if isinstance(result.error, IncompatibleError) and lock is not None:
                entry["notes"].append(draft_note(settings, lock))  # blocked by a break: is a fix drafted?
        else:
            entry["verdict"] = _verdict(result.output("check", check.Outputs))
        if lock is not None and (lock.atom.sha, lock.aiter.sha) != (atom, aiter):
            entry.update(status="failed", exit_code=int(ExitCode.USAGE))
            entry["notes"].append(f"pinned {lock.atom.sha[:9]} x {lock.aiter.sha[:10]}, not the planned pair")
        if entry["status"] == "ok" and result is not None:
            entry.update(_rendered(model, result.run_dir, settings, log, env))
            if entry.get("error"):
                entry.update(status="failed", exit_code=entry.pop("exit"), notes=[entry.pop("error")])
        if result is not None:
            reports = out_dir / "reports" / model
            reports.mkdir(parents=True, exist_ok=True)
            for name in ("check.json", "check.txt", "check.sarif", "lock.toml"):
                if (result.run_dir / name).is_file():
                    shutil.copyfile(result.run_dir / name, reports / name)
            if (reports / "lock.toml").is_file() and entry["status"] == "ok":
                entry["lock"] = f"reports/{model}/lock.toml"
        entries[model] = entry
    plan = Plan(atom, aiter, entries, notes, out_dir, gpu_hosts)
    atomic_write_json(out_dir / PLAN_FILE, plan.to_json())
    return plan


def _failed(model: str, result: RunResult, notes: list[str], error: PipelineError) -> ModelOutcome:
    """A row for a model whose run failed before render: what its pin and check did say."""
    outcome = ModelOutcome(model, "failed", int(error.exit_code), str(result.run_dir))
    pinned = result.output("pin", pin.Outputs)
    if pinned is not None:
        outcome.atom, outcome.aiter = pinned.lock.atom.sha, pinned.lock.aiter.sha
    checked = result.output("check", check.Outputs)
    if checked is not None:
        outcome.verdict = _verdict(checked)
    elif isinstance(error, IncompatibleError):
        outcome.verdict = "incompatible"
    else:
        outcome.verdict = "not checked"
    outcome.notes = [*notes, str(error)]
    return outcome


def _rendered(
    model: str, run_dir: Path, settings: Settings, log: Logger, env: Mapping[str, str]
) -> dict[str, Any]:
    """The checked run rendered: its inputs digest and aiter stage key, and whether that digest is
    already released (then no job builds it)."""
    from pipeline.image.context import read_manifest

    result = execute(BuildRequest(model=model, resume=run_dir, until="render"), settings, log, env)
    rendered = result.output("render", render.Outputs)
    if result.error is not None or rendered is None:
        why = result.error.message.splitlines()[0] if result.error is not None else "no render result"
        code = int(result.error.exit_code) if result.error is not None else int(ExitCode.USAGE)
        return {"error": f"render: {why}", "exit": code}
    manifest = read_manifest(rendered.context)
    # the registry is what is released (a CI runner has no locks/ of the last run); the locks
    # directory's record only where no registry can say
    released, said = released_in_registry(settings, model, rendered.inputs_digest, env)
    if released is None:
        if said:
            log.warn(said)
        released = _read_released(settings, model).get("inputs_digest") == rendered.inputs_digest
        said = f"{said}; " if said else ""
        said += f"locks/{model}.released.json " + ("holds" if released else "does not hold") + " it"
    return {
        "inputs_digest": rendered.inputs_digest,
        "aiter_stage": manifest.aiter_stage,
        "released": released,
        "released_by": said,
    }


def rebuild_model(
    model: str,
    settings: Settings,
    log: Logger,
    env: Mapping[str, str],
    *,
    registry: str | None,
    shared: SharedPins | None = None,
    plan: Plan | None = None,
) -> ModelOutcome:
    released = _read_released(settings, model)
    shared = shared or SharedPins()
    req = BuildRequest(
        model=model, atom_ref=shared.atom, aiter_ref=shared.aiter, until="render", registry=registry
    )
    if plan is not None:
        req = plan.request(model, registry)
    notes: list[str] = [*plan.notes] if plan is not None else []
    result = execute(req, settings, log, env)
    shared.remember(result.run_dir)
    if isinstance(result.error, IncompatibleError) and plan is None:
        # aiter's head breaks ATOM even with our patches: fall back to the newest aiter that
        # does not (`pin --auto`), and say which aiter commit broke it.
        broken = Lock.load(result.run_dir / "lock.toml")
        log.warn(f"{model}: {result.error.message.splitlines()[0]}")
        req = BuildRequest(
            model=model, atom_ref=broken.atom.ref, until="render", registry=registry, auto_aiter=True
        )
        result = execute(req, settings, log, env)
        pinned = result.output("pin", pin.Outputs)
        auto = pinned.auto if pinned is not None else None
        if auto is not None and auto.newest_compatible is not None:
            brk = auto.first_breaking
            notes.append(
                f"aiter {broken.aiter.sha[:10]} breaks ATOM {broken.atom.sha[:9]}"
                + (f"; first breaking aiter commit {brk.sha[:10]} ({brk.subject!r})" if brk else "")
                + f"; fell back to aiter {auto.newest_compatible.sha[:10]} (newest compatible)"
            )
            notes.append(draft_note(settings, broken))
    if isinstance(result.error, IncompatibleError) and (result.run_dir / "lock.toml").is_file():
        blocked = Lock.load(result.run_dir / "lock.toml")  # blocked by a break: is a fix drafted?
        code = int(result.error.exit_code)
        return ModelOutcome(model, "failed", code, notes=[str(result.error), draft_note(settings, blocked)])
    if result.error is not None:
        return _failed(model, result, notes, result.error)
    notes += obsolete_patches(settings, result.run_dir)
    rendered = result.output("render", render.Outputs)
    pinned = result.output("pin", pin.Outputs)
    if rendered is None or pinned is None:
        raise PipelineError(f"internal: the run for {model} ended without a render result.")
    outcome = ModelOutcome(
        model, "unchanged", 0, str(result.run_dir), pinned.lock.atom.sha, pinned.lock.aiter.sha
    )
    outcome.notes = notes
    outcome.verdict = _verdict(result.output("check", check.Outputs))
    if brk_note := next((n for n in notes if " breaks ATOM " in n), None):
        outcome.verdict = f"{brk_note.split(';')[0]} on its path; fell back: {outcome.verdict}"
    outcome.image = f"inputs {rendered.inputs_digest[:12]}"  # one image per inputs digest
    outcome.drift = recipe_drift(settings, model, outcome.atom) if outcome.atom else ""
    if released.get("inputs_digest") == rendered.inputs_digest:
        outcome.tag = str(released.get("ref", ""))
        outcome.smoke = "skipped (already released)"
        outcome.notes.append(f"inputs digest {rendered.inputs_digest[:12]} already released as {outcome.tag}")
        return outcome
    # Changed: the same run goes on through build, smoke and tag.
    resumed = execute(
        BuildRequest(model=model, resume=result.run_dir, until="tag", registry=registry), settings, log, env
    )
    built = resumed.output("build", build.Outputs)
    outcome.image = (built.ref or built.image) if built is not None else outcome.image
    outcome.smoke = _smoke(resumed.error, resumed.output("smoke", smoke.Outputs))
    if resumed.error is not None:
        outcome.status, outcome.exit_code = "stopped", int(resumed.error.exit_code)
        outcome.notes.append(str(resumed.error))
        return outcome
    tagged = resumed.output("tag", tag.Outputs)
    if tagged is None:  # never call a model released unless the tag stage says so
        raise PipelineError(f"internal: the run for {model} ended without a tag stage result.")
    outcome.status = "released"
    outcome.tag = tagged.ref
    return outcome


def rebuild(
    models: list[str],
    settings: Settings,
    log: Logger,
    env: Mapping[str, str],
    *,
    registry: str | None,
    plan: Plan | None = None,
) -> list[ModelOutcome]:
    outcomes = []
    shared = SharedPins()
    for model in models:
        try:
            outcomes.append(
                rebuild_model(model, settings, log, env, registry=registry, shared=shared, plan=plan)
            )
        except PipelineError as e:
            outcomes.append(ModelOutcome(model, "failed", int(e.exit_code), notes=[str(e)]))
    return outcomes


def summary_markdown(outcomes: list[ModelOutcome]) -> str:
    icon = {"released": "✅", "unchanged": "⏸", "stopped": "⚠️", "failed": "❌"}
    rows = [
        "| model | result | ATOM | aiter | verdict (its path) | image | smoke | recipe drift | tag | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        notes = "<br>".join(n.splitlines()[0] if n else n for n in o.notes)
        rows.append(
            f"| {o.model} | {icon.get(o.status, '')} {o.status} (exit {o.exit_code}) | {o.atom[:9]} | "
            f"{o.aiter[:10]} | {o.verdict} | {o.image} | {o.smoke} | {o.drift} | {o.tag} | {notes} |"
        )
    return "### pipeline rebuild\n\n" + "\n".join(rows) + "\n"


def overall_exit(outcomes: list[ModelOutcome]) -> int:
    codes = [o.exit_code for o in outcomes if o.exit_code]
    if not codes:
        return int(ExitCode.OK)
    # Anything but "no GPUs here" wins; a run that only lacked GPUs reports that.
    real = [c for c in codes if c != ExitCode.NO_HARDWARE]
    return max(real) if real else int(ExitCode.NO_HARDWARE)


# -- the workflow's build job: one inputs digest of the plan, built once for all its models --


def build_planned(
    plan: Plan,
    digest: str,
    settings: Settings,
    log: Logger,
    env: Mapping[str, str],
    *,
    registry: str | None,
    out_dir: Path,
) -> dict[str, Any]:
    """Render the planned lock of the digest's first model, refuse a render that is not the planned
    digest, build (or find) the candidate and hand it on: `out_dir/candidate.json` names it by
    registry digest for the smoke and tag jobs."""
    from dataclasses import replace

    entry = plan.build_of(digest)
    model = entry["models"][0]
    req = replace(plan.request(model, registry), until="render")
    result = execute(req, settings, log, env)
    if result.error is not None:
        raise result.error
    rendered = result.output("render", render.Outputs)
    if rendered is None:
        raise PipelineError(f"internal: the run for {model} ended without a render result.")
    if rendered.inputs_digest != digest:
        raise PipelineError(
            f"{model}: this build host renders inputs digest {rendered.inputs_digest[:12]} from the planned "
            f"lock, the plan says {digest[:12]}: its templates, wheelhouse or [image] settings differ from "
            "the plan job's; nothing was built.",
            hint="Build from the plan's own checkout and wheelhouse (the workflow downloads both), with the "
            "same pipeline.toml and PIPELINE_* variables as the plan job.",
        )
    resumed = execute(
        BuildRequest(model=model, resume=result.run_dir, until="build", registry=registry), settings, log, env
    )
    if resumed.error is not None:
        raise resumed.error
    built = resumed.output("build", build.Outputs)
    if built is None:
        raise PipelineError(f"internal: the run for {model} ended without a build result.")
    # one image for every model of the digest: each other model's recipe tools, checked on it
    shared_image_tools(entry["models"][1:], built.image, digest, settings, log, env)
    pushed = built.pushed or (built.found_in if built.found_in not in ("", "local") else "")
    if not pushed:
        raise PipelineError(
            f"the candidate of {', '.join(entry['models'])} ({built.ref}) is not in a registry: smoke and "
            "tag jobs pull it by digest from there.",
            hint="Set [tag] registry (or --registry) to the registry the GPU hosts pull from.",
        )
    record = {
        "inputs_digest": digest,
        "aiter_stage": entry["aiter_stage"],
        "models": entry["models"],
        "image": built.image,
        "candidate": pushed,  # repository:tag@sha256:... in the registry
        "skipped": built.skipped,
        "found_in": built.found_in,
        "aiter_cached": built.aiter_cached,
        "attestations": str(built.attestations) if built.attestations else "",
        "run_dir": str(resumed.run_dir),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / CANDIDATE_FILE, record)
    return record


def shared_image_tools(
    models: list[str], image: str, digest: str, settings: Settings, log: Logger, env: Mapping[str, str]
) -> None:
    """The recipe-tools self-check of each model that shares an image it did not render: the image
    is model-free, the tools its recipe's checks run are the model's."""
    if not models or not settings.image.selfcheck:
        return
    from pipeline.image.build import require_recipe_tools
    from pipeline.image.render import recipe_tools
    from pipeline.oci.engine import Engine
    from pipeline.recipes.recipe import find_recipe

    engine = Engine.connect(settings.smoke.docker_host or None, env=env, log=log)
    try:
        for model in models:
            tools, modules = recipe_tools(find_recipe(model, Path(settings.paths.recipes_dir)))
            require_recipe_tools(engine, image, tools, modules, model=model, inputs_digest=digest, log=log)
    finally:
        engine.close()
