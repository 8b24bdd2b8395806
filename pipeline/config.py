"""Configuration: one cascade, resolved into frozen, typed settings.

Layers, lowest first: packaged defaults (`defaults.toml`), the project file
(`pipeline.toml` in the working directory, or `--config FILE`), environment
variables `PIPELINE_<KEY>`, then command-line flags. Every key name is unique
across sections, so `PIPELINE_ATOM_REPO` sets `[sources] atom_repo`.

The environment is passed in as a mapping, never read deep inside. Unknown
keys and wrong types are `ConfigError`s naming the file, key and expected type.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError
from pipeline.fsutil import read_text
from pipeline.validate import SHOWN_MAX, shown

ENV_PREFIX = "PIPELINE_"
PROJECT_FILE = "pipeline.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SourcesSettings(_Section):
    atom_repo: str
    aiter_repo: str
    atom_ref: str
    aiter_ref: str
    mirror_submodules: bool
    fetch_retries: Annotated[int, Field(ge=0)]  # retries after the first attempt
    offline: bool


class PathsSettings(_Section):
    cache_dir: str
    runs_dir: str
    locks_dir: str
    recipes_dir: str
    patches_dir: str
    templates_dir: str
    wheels_dir: str
    parity_file: str


class ImageSettings(_Section):
    base_image: str
    repository: str
    gpu_archs: str
    aiter_build_cmd: str
    atom_install_cmd: str
    submodules: Literal["mirror", "in-build"]
    python_version: str
    max_jobs: str
    prebuild_kernels: int
    network: str
    offline_build: bool
    builder: Literal["auto", "buildkit", "classic"]
    docker_cli: str
    build_secrets: list[str]
    cache_repository: str
    buildx_builder: str
    selfcheck: bool
    require_git: bool


class SmokeSettings(_Section):
    docker_host: str
    hf_cache: str
    kfd_topology: str
    run_all_checks: bool


class TagSettings(_Section):
    registry: str
    tag_template: str
    moving_tags: list[str]
    push_latest: bool
    cosign: bool


class Settings(_Section):
    sources: SourcesSettings
    paths: PathsSettings
    image: ImageSettings
    smoke: SmokeSettings
    tag: TagSettings
    # Where each key's value came from (for the summary printed at start).
    origins: dict[str, str] = {}

    @property
    def cache_dir(self) -> Path:
        raw = self.paths.cache_dir
        return Path(raw).expanduser() if raw else Path(platformdirs.user_cache_dir("atom-image-pipeline"))

    @property
    def wheels_dir(self) -> Path:
        """The wheelhouse baked into the image (lm-eval, setuptools_scm, pip) for the base's python."""
        raw = self.paths.wheels_dir
        if raw:
            return Path(raw).expanduser()
        return self.cache_dir / "wheels" / f"py{self.image.python_version}"

    @property
    def mirrors_dir(self) -> Path:
        return self.cache_dir / "mirrors"

    def flat(self) -> dict[str, Any]:
        """{key: value} over all sections (keys are unique)."""
        out: dict[str, Any] = {}
        for section in SECTIONS:
            out.update(getattr(self, section).model_dump())
        return out


SECTIONS: tuple[str, ...] = ("sources", "paths", "image", "smoke", "tag")
_SECTION_MODELS: dict[str, type[_Section]] = {
    "sources": SourcesSettings,
    "paths": PathsSettings,
    "image": ImageSettings,
    "smoke": SmokeSettings,
    "tag": TagSettings,
}
# key -> section, for env vars and flags
KEY_SECTION: dict[str, str] = {
    key: section for section, model in _SECTION_MODELS.items() for key in model.model_fields
}


def _defaults() -> dict[str, dict[str, Any]]:
    text = resources.files("pipeline").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _read_toml(path: Path) -> dict[str, Any]:
    text = read_text(path, what="configuration file", error=ConfigError)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}.", hint="Fix the file and run again.") from e


def _coerce_env(key: str, raw: str, expected: Any) -> Any:
    """Turn an environment string into the key's type (lists are comma-separated)."""
    if expected is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(
            f"environment variable {ENV_PREFIX}{key.upper()}={shown(raw)}: expected a boolean (true/false)."
        )
    if expected is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(
                f"environment variable {ENV_PREFIX}{key.upper()}={shown(raw)}: expected an integer."
            ) from None
    if expected == list[str]:
        return [p.strip() for p in raw.split(",") if p.strip()]
    return raw


def load_settings(
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve the cascade. `overrides` are flag values by key (None = not given)."""
    merged = _defaults()
    origins = {key: "default" for key in KEY_SECTION}

    project = config_file if config_file is not None else (cwd or Path.cwd()) / PROJECT_FILE
    if config_file is not None and not project.is_file():
        raise ConfigError(f"configuration file {project} does not exist.", hint="Check the --config path.")
    if project.is_file():
        data = _read_toml(project)
        for section, values in data.items():
            if section not in _SECTION_MODELS:
                raise ConfigError(
                    f"{project}: unknown section [{section}]; known sections: {', '.join(SECTIONS)}."
                )
            if not isinstance(values, dict):
                raise ConfigError(f"{project}: [{section}] must be a table.")
            for key, value in values.items():
                if KEY_SECTION.get(key) != section:
                    known = ", ".join(_SECTION_MODELS[section].model_fields)
                    raise ConfigError(f"{project}: unknown key '{key}' in [{section}]; known keys: {known}.")
                merged[section][key] = value
                origins[key] = str(project)

    for name, raw in (env or {}).items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        env_section = KEY_SECTION.get(key)
        if env_section is None:
            continue  # PIPELINE_* variables that are not settings (e.g. PIPELINE_RUN_ID) are allowed
        expected = _SECTION_MODELS[env_section].model_fields[key].annotation
        merged[env_section][key] = _coerce_env(key, raw, expected)
        origins[key] = f"env {name}"

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        flag_section = KEY_SECTION.get(key)
        if flag_section is None:
            raise ConfigError(f"internal: flag for unknown setting '{key}'.")
        merged[flag_section][key] = value
        origins[key] = "flag"

    try:
        return Settings.model_validate({**merged, "origins": origins})
    except ValidationError as e:
        raise ConfigError(_describe_validation(e, origins)) from e


def _describe_validation(e: ValidationError, origins: Mapping[str, str]) -> str:
    lines = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        key = loc[-1] if loc else "?"
        if len(loc) >= 2 and loc[-1].isdigit():
            key = loc[-2]
        section = KEY_SECTION.get(key, loc[0] if loc else "?")
        where = origins.get(key, "?")
        expected = err["msg"].removeprefix("Input should be ").removeprefix("input should be ")
        got = err.get("input")
        shown_got = shown(got) if isinstance(got, str) else repr(got)[:SHOWN_MAX]
        lines.append(f"[{section}] {key} (from {where}): expected {expected}, got {shown_got}")
    return "invalid configuration: " + "; ".join(lines) + ". Fix the value and run again."
