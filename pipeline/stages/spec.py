"""The resolved, frozen description of one `pipeline build --model` run (run.json).

The raw request (flags, None = not given) is resolved once, with the settings, into
a `BuildSpec` that is printed at start and saved; each stage's `plan` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline import __version__

# Settings that may differ between the host that started a run and the one that resumes it
# (a build host and a GPU host): where things are on this host, how it reaches its engine.
# Everything else a run resolved at its start is frozen in run.json (`BuildSpec.settings`).
HOST_LOCAL: tuple[str, ...] = (
    "cache_dir",
    "runs_dir",
    "docker_host",
    "hf_cache",
    "kfd_topology",
    "docker_cli",
    "fetch_retries",
)


class BuildSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    recipe_path: Path
    atom_repo: str
    aiter_repo: str
    atom_ref: str
    aiter_ref: str
    base_image: str | None  # as given by flag; None: the configured one (or the last lock's digest)
    lock_path: Path | None  # build exactly this lock instead of pinning
    stages: tuple[str, ...]
    registry: str
    repository: str
    offline: bool = False
    auto_aiter: bool = False
    tool_version: str = __version__
    # every resolved setting but the HOST_LOCAL ones, by section: what a resume runs with
    settings: dict[str, dict[str, Any]] = {}
    source_date_epoch: int | None = None  # SOURCE_DATE_EPOCH at the start (render reads it)
    previous_lock: str | None = None  # locks/<model>.toml as it was at the start, copied into the run

    def summary_lines(self, configured_base: str, docker_host: str) -> list[str]:
        sources = [
            f"ATOM       {self.atom_repo} @ {self.atom_ref}",
            f"aiter      {self.aiter_repo} @ {self.aiter_ref}"
            + (" (newest compatible with ATOM: pin --auto)" if self.auto_aiter else ""),
        ]
        if self.lock_path is not None:  # the refs are the lock's commits
            sources = [f"lock       {self.lock_path}", *sources, "base image as the lock pins it"]
        else:
            sources.append(f"base image {self.base_image or configured_base}")
        return [
            f"model      {self.model}  (recipe {self.recipe_path})",
            *sources,
            f"stages     {' → '.join(self.stages)}",
            f"engine     {docker_host or 'local (DOCKER_HOST or /var/run/docker.sock)'}",
            f"registry   {self.registry or '(none: the tag stage pushes nowhere)'}  "
            f"repository {self.repository}",
        ]
