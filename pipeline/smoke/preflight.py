"""Preflight: does the engine have what the recipe needs? Never a silent skip.

Needs, all on the *engine's* host:
- the device nodes (``/dev/kfd``, ``/dev/dri``);
- ``hardware.gpus`` GPU nodes of the recipe's gfx architecture in the KFD
  topology (``<kfd_topology>/<n>/properties``: ``simd_count`` > 0 is a GPU,
  ``gfx_target_version`` 90500 is gfx950 / MI355);
- the model in the Hugging Face cache, or a token to download it.

A local engine (unix socket) is read directly. For a remote engine
(``--docker-host ssh://...``/``tcp://...``) the same reading runs in a
short-lived container from the image under test, with the topology, the cache
and ``/dev`` bind-mounted read-only. Anything missing raises `NoHardware`
(exit 9) with one paragraph naming exactly what is missing.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import ConfigError, InfraError, NoHardware, PipelineError
from pipeline.oci.engine import EngineAPI
from pipeline.recipes.recipe import Recipe, target_version_to_gfx
from pipeline.smoke.probe import model_in_cache, read_nodes

PreflightVia = Literal["auto", "local", "container"]

TOKEN_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def probe_source() -> str:
    return resources.files("pipeline.smoke").joinpath("probe.py").read_text(encoding="utf-8")


def engine_is_local(docker_host: str | None) -> bool:
    return not docker_host or docker_host.startswith(("unix://", "npipe://"))


@dataclass
class Preflight:
    via: str  # "local" | "container"
    nodes_dir: str
    gpus: list[dict[str, Any]] = field(default_factory=list)  # matching GPU nodes
    other_gpus: list[dict[str, Any]] = field(default_factory=list)
    devices: dict[str, bool] = field(default_factory=dict)
    hf_cache: str = ""
    hf_cache_exists: bool = False
    model_cached: bool = False
    token_env: str | None = None  # name of the token variable that is set
    missing: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "via": self.via,
            "kfd_topology": self.nodes_dir,
            "gpus": self.gpus,
            "other_gpus": self.other_gpus,
            "devices": self.devices,
            "hf_cache": self.hf_cache,
            "model_cached": self.model_cached,
            "token": self.token_env or "",
        }


def resolve_hf_cache(raw: str, *, local: bool) -> str:
    if raw.startswith("~"):
        if not local:
            raise ConfigError(
                f"[smoke] hf_cache = {raw!r} starts with '~', which cannot be resolved on a remote engine.",
                hint="Give the cache's absolute path on the GPU host (e.g. /home/me/.cache/huggingface).",
            )
        return str(Path(raw).expanduser())
    return raw


# What the engine says when a bind-mount source is missing or cannot be created.
_MOUNT_ERRORS = ("mount source path", "bind source path does not exist", "invalid mount config")


def _probe_in_container(
    engine: EngineAPI,
    image: str,
    nodes_dir: str,
    hf_cache: str,
    model_id: str,
    devices: Sequence[str],
    python: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    volumes: dict[str, dict[str, str]] = {nodes_dir: {"bind": "/host/kfd-nodes", "mode": "ro"}}
    if hf_cache:
        volumes[hf_cache] = {"bind": "/host/hf-cache", "mode": "ro"}
    if devices:
        volumes["/dev"] = {"bind": "/host/dev", "mode": "ro"}
    in_dev = ["/host/dev/" + d.removeprefix("/dev/") for d in devices]
    argv = [python, "-c", probe_source(), "preflight", "/host/kfd-nodes", "/host/hf-cache", model_id, *in_dev]
    name = f"atom-smoke-preflight-{secrets.token_hex(4)}"
    try:
        with engine.run(
            image, argv, name=name, volumes=volumes, labels=dict(labels), network_mode="none"
        ) as c:
            code = c.wait(timeout=120)
            out = c.logs()
    except PipelineError as e:
        mount_problem = any(s in e.message for s in _MOUNT_ERRORS)
        if isinstance(e, InfraError) and not mount_problem:
            raise
        raise NoHardware(
            f"The preflight probe could not mount the engine host's paths ({e.message}); the usual cause is "
            f"that the KFD topology {nodes_dir} does not exist there, i.e. it has no amdgpu/KFD driver.",
            hint="Run the smoke test against an MI355 host: "
            "pipeline smoke --docker-host ssh://user@mi355-host ...",
            evidence=e.evidence,
        ) from None
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        data: dict[str, Any] = json.loads(line)
    except ValueError:
        raise InfraError(
            f"The preflight probe in {image} exited {code} without a result (does the image have {python}?).",
            evidence=out[-3000:],
        ) from None
    back = dict(zip(in_dev, devices, strict=True))
    data["devices"] = {back.get(k, k): v for k, v in data.get("devices", {}).items()}
    return data


def run_preflight(
    engine: EngineAPI,
    *,
    image: str,
    recipe: Recipe,
    nodes_dir: str,
    hf_cache_raw: str,
    env: Mapping[str, str],
    docker_host: str | None,
    via: PreflightVia = "auto",
    labels: Mapping[str, str] | None = None,
) -> Preflight:
    local = engine_is_local(docker_host)
    mode = ("local" if local else "container") if via == "auto" else via
    hf_cache = resolve_hf_cache(hf_cache_raw, local=local) if hf_cache_raw else ""
    hw = recipe.hardware
    if mode == "local":
        nodes, nodes_error = read_nodes(nodes_dir)
        devices = {d: os.path.exists(d) for d in hw.devices}
        hf_exists = bool(hf_cache) and os.path.isdir(hf_cache)
        cached = bool(hf_cache) and model_in_cache(hf_cache, recipe.model.id)
    else:
        data = _probe_in_container(
            engine,
            image,
            nodes_dir,
            hf_cache,
            recipe.model.id,
            hw.devices,
            recipe.server.python,
            labels or {},
        )
        nodes, nodes_error = list(data.get("nodes") or []), data.get("nodes_error")
        devices = {str(k): bool(v) for k, v in (data.get("devices") or {}).items()}
        hf_exists = bool(data.get("hf_cache_exists"))
        cached = bool(data.get("model_cached"))

    want = hw.gfx_target_version
    gpu_nodes = [n for n in nodes if int(n.get("simd_count", 0)) > 0]
    for n in gpu_nodes:
        n["gfx"] = target_version_to_gfx(int(n.get("gfx_target_version", 0)))
    match = [n for n in gpu_nodes if int(n.get("gfx_target_version", 0)) == want]
    other = [n for n in gpu_nodes if int(n.get("gfx_target_version", 0)) != want]
    token = next((t for t in TOKEN_NAMES if t in recipe.secrets and env.get(t)), None)

    pf = Preflight(
        via=mode,
        nodes_dir=nodes_dir,
        gpus=match,
        other_gpus=other,
        devices=devices,
        hf_cache=hf_cache,
        hf_cache_exists=hf_exists,
        model_cached=cached,
        token_env=token,
    )
    gpu_label = f"{hw.gfx}{' (' + hw.name + ')' if hw.name else ''}"
    if len(match) < hw.gpus:
        found = f"found {len(match)}"
        if nodes_error:
            found += f" ({nodes_error})"
        elif other:
            kinds = sorted({str(n["gfx"]) for n in other})
            found += f" (and {len(other)} GPU(s) of another architecture: {', '.join(kinds)})"
        elif not gpu_nodes:
            found += f" (the KFD topology at {nodes_dir} lists no GPU node)"
        pf.missing.append(f"{hw.gpus} {gpu_label} GPU(s): {found}")
    for dev, present in devices.items():
        if not present:
            pf.missing.append(f"device {dev} (is the amdgpu driver loaded?)")
    if not cached and token is None:
        where = (
            f"in the Hugging Face cache {hf_cache}"
            if hf_cache
            else "in a Hugging Face cache ([smoke] hf_cache is empty)"
        )
        token_names = " or ".join(t for t in TOKEN_NAMES if t in recipe.secrets) or "a token"
        pf.missing.append(
            f"the model {recipe.model.id} {where}, or {token_names} in the environment to download it"
        )
    return pf


def no_hardware_error(pf: Preflight, recipe: Recipe, *, image: str, engine_desc: str) -> NoHardware:
    what = "; ".join(pf.missing)
    return NoHardware(
        f"The smoke test of {recipe.name} cannot run on {engine_desc}: missing {what}. "
        "Nothing was started and no verdict of 'passed' was written.",
        hint=(
            f"Run it where {recipe.hardware.gpus} {recipe.hardware.gfx} GPUs are: on that host, "
            f"`pipeline smoke --image {image} --model {recipe.name}`, or from here "
            f"`pipeline smoke --image {image} --model {recipe.name} --docker-host ssh://user@mi355-host`"
            ", with the model in [smoke] hf_cache or HF_TOKEN exported."
        ),
    )
