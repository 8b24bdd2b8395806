"""Time from a server crash to the smoke verdict (target: under 5 s).

Runs `run_smoke` against the test server image in "crash" mode: after its warm-up the
server prints its wall clock ("crash at <epoch>"), then the bug report's traceback, and
exits 1. The figure is verdict.json's mtime minus that printed time: detection in the log
stream, stopping, removing the container and writing the three report files, all included.

The baseline is what a wait-for-timeout harness spends on the same crash: the readiness
time limit of the real recipe (recipes/MiniMax-M3-MXFP4.yaml, ATOM CI's 45 min).

    python bench/bench_smoke_crash.py [--runs 5]

Needs a Docker engine and the local test base image (`make setup`); builds and removes
its own image.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import load_settings  # noqa: E402
from pipeline.log import Logger  # noqa: E402
from pipeline.oci.engine import Engine  # noqa: E402
from pipeline.recipes.recipe import load_recipe  # noqa: E402
from pipeline.smoke import SmokeOptions, load_verdict, run_smoke  # noqa: E402
from tests.fixtures.sysfs import make_sysfs  # noqa: E402

BASE_IMAGE = os.environ.get("ATOM_PIPELINE_TEST_BASE_IMAGE", "atom-pipeline-test/bookworm-python3:1")
TARGET_S = 5.0
LABEL = "org.atom-image-pipeline.bench"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    real = load_recipe(REPO / "recipes" / "MiniMax-M3-MXFP4.yaml")
    baseline = real.server.ready_timeout_s

    engine = Engine.connect()
    work = Path(tempfile.mkdtemp(prefix="bench-smoke-crash-"))
    tag = f"atom-pipeline-bench/smoke-server:{os.getpid()}"
    try:
        ctx = work / "ctx"
        ctx.mkdir()
        for f in (REPO / "tests" / "servers").glob("*.py"):
            shutil.copy(f, ctx / f.name)
        (ctx / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY *.py /opt/smoke/\n")
        engine.build(ctx, tag=tag, labels={LABEL: "1"})

        text = (REPO / "tests" / "servers" / "recipe-test.yaml").read_text()
        text = text.replace("SMOKE_TEST_MODE: healthy", "SMOKE_TEST_MODE: crash")
        text = text.replace('SMOKE_TEST_WARMUP_S: "1"', 'SMOKE_TEST_WARMUP_S: "3"')
        text = text.replace("ready_timeout_s: 20", f"ready_timeout_s: {baseline:g}")
        recipe_path = work / "recipe-crash.yaml"
        recipe_path.write_text(text)
        recipe = load_recipe(recipe_path)
        hf = work / "hf" / "hub" / "models--smoke-test--tiny-chat" / "snapshots" / "x"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
        sysfs = make_sysfs(work / "sys")
        settings = load_settings(env={"PIPELINE_HF_CACHE": str(work / "hf")}, cwd=work)

        figures: list[float] = []
        exits: list[float] = []
        for i in range(args.runs):
            run_dir = work / f"run{i}"
            log = Logger(stream=io.StringIO())
            log.attach(run_dir)
            verdict = run_smoke(
                engine,
                image=tag,
                recipe=recipe,
                recipe_path=recipe_path,
                settings=settings,
                env={},
                run_dir=run_dir,
                log=log,
                sysfs_root=sysfs,
                options=SmokeOptions(labels={LABEL: "1"}),
            )
            returned = time.time()  # container removed, files written
            log.close()
            m = re.search(r"crash at (\d+\.\d+)", (run_dir / "server.log").read_text())
            assert m, "the server did not print its crash time"
            assert load_verdict(run_dir).reason.startswith(
                "RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip()"
            )
            seconds = (run_dir / "verdict.json").stat().st_mtime - float(m.group(1))
            figures.append(seconds)
            exits.append(returned - float(m.group(1)))
            print(
                f"run {i + 1}: crash -> verdict {seconds:.3f} s, -> container removed {exits[-1]:.3f} s "
                f"(reason: {verdict.reason[:50]}...)"
            )
        med, worst = statistics.median(figures), max(figures)
        print()
        print(
            f"time from server crash to verdict: median {med:.3f} s, max {worst:.3f} s over {args.runs} runs"
        )
        print(
            f"time from server crash to run_smoke returning (container removed): median "
            f"{statistics.median(exits):.3f} s, max {max(exits):.3f} s"
        )
        print(f"recipe readiness time limit (a wait-for-timeout harness): {baseline:.0f} s")
        print(
            f"ratio: {baseline / med:,.0f}x faster than waiting for the limit; "
            f"target < {TARGET_S:.0f} s: {'met' if worst < TARGET_S else 'NOT met'}"
        )
        return 0 if worst < TARGET_S else 1
    finally:
        for cid in engine.containers_with_label(LABEL, "1"):
            engine.api.remove_container(cid, force=True, v=True)
        engine.remove_image(tag, force=True)
        engine.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
