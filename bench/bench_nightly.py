"""The scheduled rebuild, simulated: today's workflow against the jobs-by-machine one (issue 29).

The plan is real: `pipeline rebuild --write-plan` over the first N real recipes in recipes/, at the
mirrors' heads (ATOM_MIRROR, AITER_MIRROR), timed. A plan that leaves models out is a normal nightly:
they are reported and not scheduled; any other failure of the plan stops the bench. Its builds (one
per distinct inputs digest, a lead per aiter stage key), its smoke waves and its smoke lengths (the
plan's `smoke_s`: the recipe's recorded benchmark durations plus 15 minutes for the server's start
and GSM8K, 30 minutes when the recipe records none) are what gets scheduled. The rest is simulated
with stated durations:

- aiter's stage: --aiter-seconds (600 s, as bench/bench_build.py simulates it);
- ATOM's stage and the image around it: --atom-seconds (120 s); a candidate pushed or pulled, and
  aiter's stage imported from the registry cache: --transfer-seconds (60 s);
- tag: --tag-seconds (60 s) per model, after the tag job pulls each distinct image once (a transfer);
- every job's start (checkout, artifacts, the tool's install): --job-start-seconds (60 s).

The schedule is GitHub's, job by job as .github/workflows/rebuild.yml wires them: a job starts when
every job it `needs` is done (the whole matrix); its matrix jobs queue in matrix order, and a free
runner of the job's label takes the oldest queued one (b build hosts, g GPU hosts, hosted runners
without limit). New: plan (hosted) -> build-lead (build) -> smoke-lead (GPU, the lead builds'
models) and build-first (build, the first g follows) -> smoke-first (GPU, their models) and build
(build, the other follows) -> smoke (GPU, theirs) -> tag (build, one job); each smoke wave longest
first. "1 wave" is one smoke job after every build, in name order (the workflow before the waves).
Today (.github/workflows/rebuild.yml before issue 29): the pins job and then every model's job,
one after another (`max-parallel: 1`), on one MI355 runner: build (the first compiles aiter, the
others of an aiter pin find its stage in that runner's cache, and the other models of an image
find the image), smoke, tag. Everything runs on the GPU host.

Two rows per count: "plan", the real plan as written (tonight's nightly), and "all", the same
recipes as if no model were left out (each left-out model planned at the plan's pair, so it
shares the pair's one image: the image is model-free): the capacity the goal is about, since at
the mirrors' heads the check may leave most models out. The floor is what no schedule on g GPU
hosts beats: the plan, the lead build, then the smoke jobs spread perfectly (their sum / g), then
the tag job.

    ATOM_MIRROR=... AITER_MIRROR=... python bench/bench_nightly.py [--counts 1,5,15]
        [--build-hosts 2] [--gpu-hosts 4]
    python bench/bench_nightly.py --plan-dir DIR      (reuse plans written by an earlier run)

Goal: 15 recipes on 2 build hosts and 4 GPU hosts in at most 0.3x today's wall time, and no
GPU-host time spent compiling.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.rebuild import Plan, expected_smoke_s  # noqa: E402

GOAL_RATIO = 0.3
# A base image pinned by a well-formed digest: the plan renders, nothing is pulled.
BASE = "rocm/pytorch:rocm7.2.4_ubuntu22.04_py3.10_pytorch_release_2.10.0@sha256:" + "0" * 64
HOSTED = 10_000  # GitHub-hosted runners: no limit that matters here


@dataclass(frozen=True)
class Costs:
    aiter: float
    atom: float
    transfer: float
    tag: float
    start: float  # every job's start: checkout, artifacts, the tool's install


def write_plan(models: list[str], out: Path) -> float:
    """Run the real `pipeline rebuild --write-plan` for these recipes; its wall seconds.

    Models left out are a normal nightly (the exit is the worst of their codes, the plan written
    whole); an exit that is not the written plan's, or no plan, stops the bench."""
    atom, aiter = os.environ.get("ATOM_MIRROR", ""), os.environ.get("AITER_MIRROR", "")
    if not (atom and aiter and Path(atom).is_dir() and Path(aiter).is_dir()):
        sys.exit(
            "set ATOM_MIRROR and AITER_MIRROR to bare mirrors of ROCm/ATOM and ROCm/aiter "
            "(or pass --plan-dir)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    work = Path(tempfile.mkdtemp(prefix="bench-nightly-"))
    env.update(
        PIPELINE_ATOM_REPO=atom,
        PIPELINE_AITER_REPO=aiter,
        PIPELINE_OFFLINE="1",  # the mirrors as they are: no fetch, no registry
        PIPELINE_SUBMODULES="in-build",  # aiter's submodules need no mirror of their own to render
        PIPELINE_BASE_IMAGE=BASE,
        PIPELINE_RECIPES_DIR=str(REPO / "recipes"),
        PIPELINE_PATCHES_DIR=str(REPO / "patches" / "atom"),
        PIPELINE_TEMPLATES_DIR=str(REPO / "dockerfiles"),
        PIPELINE_RUNS_DIR=str(work / "runs"),
        PIPELINE_LOCKS_DIR=str(work / "locks"),
        PIPELINE_WHEELS_DIR=str(work / "no-wheelhouse"),
        PIPELINE_CACHE_DIR=os.environ.get("BENCH_CACHE_DIR", str(work / "cache")),
        PYTHONPATH=str(REPO),  # this checkout's pipeline, whatever is installed
    )
    argv = [
        sys.executable,
        "-m",
        "pipeline",
        "rebuild",
        "--write-plan",
        str(out),
        *(f"--model={m}" for m in models),
    ]
    (out / "plan.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    expected = None
    if (out / "plan.json").is_file():
        data = json.loads((out / "plan.json").read_text())
        left = [e for e in data["models"].values() if e["status"] != "ok"]
        expected = max((int(e.get("exit_code") or 0) or 2 for e in left), default=0)
    if proc.returncode != expected:
        sys.exit(
            f"rebuild --write-plan failed (exit {proc.returncode}, "
            f"{'no plan' if expected is None else f'its plan says exit {expected}'}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return took


def as_if_planned(plan: Plan) -> Plan:
    """The plan with every left-out model planned at the plan's pair. The image is model-free (its
    inputs digest is the pair's with the settings), so a left-out model joins the image of the
    plan's pair: the planned models' image, or one image for all when the plan built nothing."""
    planned = [e for e in plan.models.values() if e["status"] == "ok" and e.get("inputs_digest")]
    digest = planned[0]["inputs_digest"] if planned else "as-if-the-pair"
    key = planned[0].get("aiter_stage", "the-pair") if planned else "the-pair"
    models: dict[str, dict[str, Any]] = {}
    for m, e in plan.models.items():
        if e["status"] == "ok":
            models[m] = e
        else:
            models[m] = {**e, "status": "ok", "inputs_digest": digest, "aiter_stage": key}
    return Plan(plan.atom, plan.aiter, models, plan.notes, plan.root, plan.gpu_hosts)


def tag_job(plan: Plan, c: Costs) -> list[float]:
    """The one tag job: each distinct image pulled once (models of one image share it), then each
    model's tags."""
    m = plan.matrix()
    if not m["smoke"]:
        return []
    images = {plan.models[x].get("inputs_digest", x) for x in m["smoke"]}
    return [c.start + len(images) * c.transfer + len(m["smoke"]) * c.tag]


# -- GitHub's scheduling of the workflow's jobs --


@dataclass
class Job:
    name: str
    pool: str  # the runner label: hosted, build, gpu
    needs: list[str]
    items: list[float]  # the matrix, in its order: each matrix job's seconds
    done_at: float = -1.0
    left: int = 0
    busy: float = field(default=0.0)


def run_jobs(jobs: list[Job], hosts: dict[str, int]) -> tuple[float, dict[str, float]]:
    """(wall seconds, busy seconds per pool): a job starts when all it needs are done; its matrix
    jobs queue in order and a free runner of its label takes the oldest queued one."""
    by_name = {j.name: j for j in jobs}
    free = dict(hosts)
    queue: dict[str, list[tuple[float, int, str, float]]] = {p: [] for p in hosts}
    events: list[tuple[float, int, str, str]] = []  # (time, seq, pool, job) a matrix job ends
    seq = 0
    busy = dict.fromkeys(hosts, 0.0)
    started: set[str] = set()

    def release(now: float) -> None:
        nonlocal seq
        changed = True
        while changed:
            changed = False
            for j in jobs:
                if j.name in started or any(by_name[n].done_at < 0 for n in j.needs):
                    continue
                started.add(j.name)
                if not j.items:  # an empty matrix: the job is skipped, done at once
                    j.done_at = now
                    changed = True
                    continue
                j.left = len(j.items)
                for d in j.items:
                    seq += 1
                    queue[j.pool].append((now, seq, j.name, d))
        for pool in hosts:
            queue[pool].sort()
            while free[pool] and queue[pool]:
                _, _, name, d = queue[pool].pop(0)
                free[pool] -= 1
                busy[pool] += d
                seq += 1
                heapq.heappush(events, (now + d, seq, pool, name))

    release(0.0)
    end = 0.0
    while events:
        now, _, pool, name = heapq.heappop(events)
        end = max(end, now)
        free[pool] += 1
        j = by_name[name]
        j.left -= 1
        if j.left == 0:
            j.done_at = now
        release(now)
    if any(j.done_at < 0 for j in jobs):
        raise SystemExit("internal: a job never ran (a `needs` cycle in the simulated workflow)")
    return end, busy


def new(
    plan: Plan, plan_s: float, c: Costs, b: int, g: int, waves: bool = True
) -> tuple[float, float, float]:
    """(wall, GPU-host seconds, GPU-host seconds compiling) of the workflow as it is wired."""
    m = plan.matrix()
    lead = [c.start + c.aiter + c.atom + c.transfer for _ in m["lead"]]
    follow = [c.start + c.transfer + c.atom + c.transfer for _ in m["follow"]]  # import aiter, build, push

    def smoke(models: list[str]) -> list[float]:
        return [c.start + c.transfer + plan.smoke_s(x) for x in models]  # pull by digest, then smoke

    tag = tag_job(plan, c)
    jobs = [Job("plan", "hosted", [], [c.start + plan_s]), Job("build-lead", "build", ["plan"], lead)]
    if waves:
        first = [c.start + c.transfer + c.atom + c.transfer for _ in m["follow_first"]]
        rest = [c.start + c.transfer + c.atom + c.transfer for _ in m["follow_rest"]]
        jobs += [
            Job("build-first", "build", ["plan", "build-lead"], first),
            Job("build", "build", ["plan", "build-lead", "build-first"], rest),
            Job("smoke-lead", "gpu", ["plan", "build-lead"], smoke(m["smoke_lead"])),
            Job("smoke-first", "gpu", ["plan", "build-first"], smoke(m["smoke_first"])),
            Job("smoke", "gpu", ["plan", "build"], smoke(m["smoke_rest"])),
            Job("tag", "build", ["plan", "smoke-lead", "smoke-first", "smoke"], tag),
        ]
    else:  # one smoke job after every build, in name order
        jobs += [
            Job("build", "build", ["plan", "build-lead"], follow),
            Job("smoke", "gpu", ["plan", "build-lead", "build"], smoke(sorted(m["smoke"]))),
            Job("tag", "build", ["plan", "smoke"], tag),
        ]
    wall, busy = run_jobs(jobs, {"hosted": HOSTED, "build": b, "gpu": g})
    # GPU-host time compiling: the build jobs that run on a GPU host's label (none, as wired)
    compiling = sum(sum(j.items) for j in jobs if j.pool == "gpu" and j.name.startswith("build"))
    return wall, busy["gpu"], compiling


def today(plan: Plan, plan_s: float, c: Costs) -> tuple[float, float, float]:
    """(wall, GPU-host seconds, GPU-host seconds compiling): all serial on one MI355 runner, with
    today's tool: the first model of an image builds it (the first of an aiter pin compiles aiter),
    the others of that image find it on the runner's engine."""
    wall = c.start + plan_s
    compiled: set[str] = set()
    built: set[str] = set()
    compiling = 0.0
    for model in sorted(m for m, e in plan.models.items() if e["status"] == "ok" and not e.get("released")):
        entry = plan.models[model]
        key, image = entry.get("aiter_stage", ""), entry.get("inputs_digest", model)
        build = 0.0
        if image not in built:
            build = c.atom + c.transfer + (c.aiter if key not in compiled else 0.0)
            compiling += build - c.transfer
        compiled.add(key)
        built.add(image)
        wall += c.start + build + plan.smoke_s(model) + c.tag
    return wall, wall, compiling


def floor(plan: Plan, plan_s: float, c: Costs, g: int) -> tuple[float, str]:
    """No schedule on g GPU hosts beats this: the plan, the lead build, every smoke job spread
    perfectly over the GPU hosts, then the tag job. (seconds, what it is made of)"""
    m = plan.matrix()
    first = c.start + plan_s
    if not m["smoke"]:
        return first, f"plan {first / 3600:.2f} h"
    smokes = sum(c.start + c.transfer + plan.smoke_s(x) for x in m["smoke"])
    lead = c.start + c.aiter + c.atom + c.transfer
    tag = sum(tag_job(plan, c))
    said = (
        f"plan {first / 3600:.2f} h + lead build {lead / 3600:.2f} h + smoke {smokes / 3600:.2f} h / {g} "
        f"GPU hosts = {smokes / g / 3600:.2f} h + tag job {tag / 3600:.2f} h"
    )
    return first + lead + smokes / g + tag, said


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="1,5,15")
    ap.add_argument("--build-hosts", type=int, default=2)
    ap.add_argument("--gpu-hosts", type=int, default=4)
    ap.add_argument("--aiter-seconds", type=float, default=600.0)
    ap.add_argument("--atom-seconds", type=float, default=120.0)
    ap.add_argument("--transfer-seconds", type=float, default=60.0)
    ap.add_argument("--tag-seconds", type=float, default=60.0)
    ap.add_argument("--job-start-seconds", type=float, default=60.0)
    ap.add_argument(
        "--plan-dir", type=Path, help="read (or write) plan-<n>/ here instead of a temporary directory"
    )
    args = ap.parse_args()
    c = Costs(
        args.aiter_seconds, args.atom_seconds, args.transfer_seconds, args.tag_seconds, args.job_start_seconds
    )
    b, g = args.build_hosts, args.gpu_hosts
    recipes = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    root = args.plan_dir or Path(tempfile.mkdtemp(prefix="bench-nightly-plans-"))
    print(
        f"load: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min) on {os.cpu_count()} cores; "
        "plan times are measured, the rest simulated"
    )
    print(
        f"{'recipes':>7} {'row':>4} {'smoke':>5} {'images':>6} {'aiter':>5} {'plan s':>6} | "
        f"{'today h':>7} {'GPU h':>6} {'GPU compile h':>13} | {'1 wave h':>8} | "
        f"{'new h':>6} {'GPU h':>6} {'GPU compile h':>13} | {'ratio':>5} {'floor h':>7} {'floor x':>7}"
    )
    verdicts = []
    for n in [int(x) for x in args.counts.split(",")]:
        models = recipes[:n]
        out = root / f"plan-{n}"
        out.mkdir(parents=True, exist_ok=True)
        timing = out / "plan-seconds.txt"
        if (out / "plan.json").is_file() and timing.is_file():
            plan_s = float(timing.read_text())
        else:
            plan_s = write_plan(models, out)
            timing.write_text(f"{plan_s:.1f}\n")
        written = Plan.load(out / "plan.json")
        for e_model, e in written.models.items():  # a plan from before smoke_s: the recipe's length
            e.setdefault("smoke_s", expected_smoke_s(e_model, REPO / "recipes"))
        written.gpu_hosts = g  # the workflow passes MI355_RUNNERS to the plan: its first wave
        for row, plan in (("plan", written), ("all", as_if_planned(written))):
            t_wall, t_gpu, t_comp = today(plan, plan_s, c)
            n_wall, n_gpu, n_comp = new(plan, plan_s, c, b, g)
            one_wave, _, _ = new(plan, plan_s, c, b, g, waves=False)
            low, low_said = floor(plan, plan_s, c, g)
            builds = plan.builds()
            ratio = n_wall / t_wall if t_wall else 0.0
            print(
                f"{n:>7} {row:>4} {len(plan.matrix()['smoke']):>5} {len(builds):>6} "
                f"{len({x['aiter_stage'] for x in builds}):>5} {plan_s:>6.0f} | "
                f"{t_wall / 3600:>7.2f} {t_gpu / 3600:>6.2f} {t_comp / 3600:>13.2f} | "
                f"{one_wave / 3600:>8.2f} | "
                f"{n_wall / 3600:>6.2f} {n_gpu / 3600:>6.2f} {n_comp / 3600:>13.2f} | {ratio:>5.2f} "
                f"{low / 3600:>7.2f} {low / t_wall if t_wall else 0.0:>7.2f}"
            )
            if n == 15:
                verdicts.append(
                    (row, len(plan.matrix()["smoke"]), ratio, n_comp, low, low_said, t_wall, n_wall)
                )
        left = written.matrix()["left_out"]
        if left:
            print(f"        left out of the plan (reported, not scheduled): {', '.join(left)}")
    lengths = sorted({round(expected_smoke_s(m, REPO / "recipes") / 60) for m in recipes})
    print(
        f"(b={b} build hosts, g={g} GPU hosts; expected smoke lengths of the recipes: "
        f"{', '.join(f'{x} min' for x in lengths)}; ratio and floor x: to today's wall time)"
    )
    for row, smoked, ratio, comp, low, low_said, t_wall, n_wall in verdicts:
        head = f"goal (15 recipes, row {row}: <= {GOAL_RATIO}x today, no GPU-host compile):"
        if not smoked:
            print(f"{head} not judged: the plan schedules no model (every recipe left out), nothing to run")
            continue
        met = ratio <= GOAL_RATIO and comp == 0
        print(
            f"{head} {'met' if met else 'NOT met'}: {n_wall / 3600:.2f} h against today's "
            f"{t_wall / 3600:.2f} h = {ratio:.2f}x, {ratio / GOAL_RATIO:.2f}x the target"
        )
        print(
            f"  floor {low / 3600:.2f} h = {low / t_wall:.2f}x today ({low_said})"
            + (
                f": {GOAL_RATIO}x is below it, impossible with these smoke lengths on {g} GPU hosts"
                if low / t_wall > GOAL_RATIO
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
