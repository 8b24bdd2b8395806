"""Build times on the fixture build: cold, patch-only rebuild, unchanged inputs (ratios to the cold build).

Targets (from the issue): the unchanged-inputs run takes under a second; the
patch-only rebuild does not re-run the aiter stage.

The fixture aiter "build" is instant, so it is made to take `--aiter-seconds`
(default 20 s) with a sleep after it: a stand-in for the hour the real aiter
build takes on the ROCm base image. Every run uses fresh fixture trees (a
random nonce), so the cold build really is cold. The base image is the local
test image, pushed to a throwaway local registry so the lock pins it by digest
as production does.

    python bench/bench_build.py [--aiter-seconds 20]

Needs a Docker engine, the local test base image and /usr/bin/docker-registry
(`make setup`). Removes every image it made.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import load_settings  # noqa: E402
from pipeline.dockerw import Engine  # noqa: E402
from pipeline.gitw import GitRepo  # noqa: E402
from pipeline.imagebuild import build_image  # noqa: E402
from pipeline.log import Logger  # noqa: E402
from pipeline.render import render_context  # noqa: E402
from tests.fixtures.build_repos import (  # noqa: E402
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    CK_PATH,
    BuildRepos,
    make_build_repos,
)

BASE_IMAGE = os.environ.get("ATOM_PIPELINE_TEST_BASE_IMAGE", "atom-pipeline-test/bookworm-python3:1")
REGISTRY_BIN = os.environ.get("ATOM_PIPELINE_TEST_REGISTRY_BIN", "/usr/bin/docker-registry")
LABEL = "org.atom-image-pipeline.bench"
TEMPLATES = REPO / "dockerfiles"


@contextmanager
def local_registry(root: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "storage").mkdir(parents=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(8)}\n"
    )
    proc = subprocess.Popen(
        [REGISTRY_BIN, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(150):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("docker-registry did not start")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def render(repos: BuildRepos, base: str, out: Path, aiter_cmd: str) -> Path:
    name, digest = base.split("@")
    settings = load_settings(
        env={
            "PIPELINE_BASE_IMAGE": name,
            "PIPELINE_REPOSITORY": "atom-pipeline-bench/atom",
            "PIPELINE_AITER_BUILD_CMD": aiter_cmd,
            "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
        },
        cwd=out.parent,
    )
    ctx = render_context(
        lock=repos.lock(base_ref=name, base_digest=digest),
        atom=GitRepo(repos.atom),
        atom_tree_sha=repos.patched_sha,
        aiter=GitRepo(repos.aiter),
        submodule_repos={CK_PATH: GitRepo(repos.ck)},
        recipe_path=repos.recipe,
        settings=settings,
        out_dir=out,
        templates_dir=TEMPLATES,
    )
    return ctx.dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiter-seconds", type=float, default=20.0, help="simulated aiter build time")
    args = ap.parse_args()
    aiter_cmd = f"{AITER_BUILD_CMD} && sleep {args.aiter_seconds:g}"

    engine = Engine.connect()
    run_id = uuid.uuid4().hex[:10]
    labels = {LABEL: run_id}
    work = Path(tempfile.mkdtemp(prefix="bench-build-"))
    log = Logger(stream=io.StringIO())
    cleanup: list[str] = []
    try:
        with local_registry(work / "registry") as host:
            repo = f"{host}/atom-pipeline-bench/base"
            engine.tag(BASE_IMAGE, repo, "1")
            cleanup.append(f"{repo}:1")
            digest = engine.push(repo, "1")
            cleanup.append(f"{repo}@{digest}")
        base = f"{repo}:1@{digest}"

        repos = make_build_repos(work / "upstreams", nonce=run_id)
        ctx1 = render(repos, base, work / "ctx1", aiter_cmd)
        t0 = time.monotonic()
        cold = build_image(engine, ctx1, tag=None, log=log, run_dir=work / "run1", extra_labels=labels)
        t_cold = time.monotonic() - t0

        repos2 = repos.repatch("-bench")
        t0 = time.monotonic()
        ctx2 = render(repos2, base, work / "ctx2", aiter_cmd)
        t_render = time.monotonic() - t0
        t0 = time.monotonic()
        patch = build_image(engine, ctx2, tag=None, log=log, run_dir=work / "run2", extra_labels=labels)
        t_patch = time.monotonic() - t0

        t0 = time.monotonic()
        same = build_image(engine, ctx2, tag=None, log=log, run_dir=work / "run3")
        t_same = time.monotonic() - t0
        t0 = time.monotonic()
        cli = subprocess.run(
            [sys.executable, "-m", "pipeline", "build", "--context", str(ctx2)],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_REPOSITORY": "atom-pipeline-bench/atom"},
            capture_output=True,
            text=True,
        )
        t_cli = time.monotonic() - t0

        print(
            f"fixture build; aiter build simulated as {args.aiter_seconds:g} s (the real one: about an hour)"
        )
        print(f"cold build:             {t_cold:7.2f} s   1.000 x cold   ({cold.steps} steps)")
        print(
            f"patch-only rebuild:     {t_patch:7.2f} s   {t_patch / t_cold:.3f} x cold   "
            f"({patch.cached_steps}/{patch.steps} steps cached; aiter stage from cache: "
            f"{'yes' if patch.aiter_cached else 'NO'}; render took {t_render:.2f} s)"
        )
        print(
            f"unchanged inputs:       {t_same:7.3f} s   {t_same / t_cold:.4f} x cold   "
            f"(skipped: {'yes' if same.skipped else 'NO'}; target < 1 s)"
        )
        print(
            f"  same via the CLI:     {t_cli:7.3f} s   {t_cli / t_cold:.4f} x cold   "
            f"(`pipeline build --context`, process start included; exit {cli.returncode})"
        )
        ok = patch.aiter_cached is True and same.skipped and t_same < 1.0 and cli.returncode == 0
        if not ok:
            print("TARGET MISSED", file=sys.stderr)
            if cli.returncode:
                print(cli.stderr[-2000:], file=sys.stderr)
        return 0 if ok else 1
    finally:
        for info in engine.images_with_label(LABEL, run_id):
            for ref in [*info.tags, info.id]:
                engine.remove_image(ref, force=True)
        for ref in cleanup:
            engine.remove_image(ref, force=True)
        engine.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
