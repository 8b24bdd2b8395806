"""Configuration: one cascade, resolved into frozen, typed settings.

Layers, lowest first: packaged defaults (`defaults.toml`), the project file
(`--config FILE`, else the first `pipeline.toml` from the working directory up
to the repository root, as pre-commit finds its file), environment variables
`PIPELINE_<KEY>`, then command-line flags. Every key name is unique across
sections, so `PIPELINE_ATOM_REPO` sets `[sources] atom_repo`. A project file
found above the working directory is the project's root: relative `[paths]`
from the defaults and the file are taken from its directory.

The environment is passed in as a mapping, never read deep inside. Unknown
keys and wrong types are `ConfigError`s naming the file, key and expected type.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.envvars import ENV_PREFIX, OTHER_ENV, PROJECT_FILE
from pipeline.errors import ConfigError
from pipeline.fsutil import read_text
from pipeline.validate import SHOWN_MAX, shown


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
    keep_runs: Annotated[int, Field(ge=0)]  # run directories kept; older ones go at the next run (0: all)
    locks_dir: str
    recipes_dir: str
    patches_dir: str
    templates_dir: str
    wheels_dir: str
    parity_file: str


_GFX = r"gfx[0-9]{1,2}[0-9a-f]{2}(?::(?:xnack|sramecc)[+-])*"
_GPU_ARCHS = re.compile(rf"^{_GFX}(?:;{_GFX})*$")


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

    @field_validator("gpu_archs")
    @classmethod
    def _archs(cls, v: str) -> str:
        if not _GPU_ARCHS.match(v):
            raise ValueError(
                "GPU architectures as aiter's GPU_ARCHS takes them: gfx names separated by ';' "
                "(e.g. gfx950 or gfx942;gfx950, a target feature as gfx90a:xnack+)"
            )
        return v


#: Environment variables a recipe may hand to the model server with no configuration.
RECIPE_SECRETS = ("HF_TOKEN",)
# The tool's own credentials: never a recipe's (the server runs upstream code).
_RESERVED_SECRET = re.compile(r"^(PIPELINE_|REGISTRY_|DOCKER_|COSIGN_|SIGSTORE_)|REGISTRY")


def reserved_secret(name: str) -> bool:
    """Whether `name` is one of the tool's own credentials (push, registry API, signing)."""
    return _RESERVED_SECRET.search(name.upper()) is not None


class SmokeSettings(_Section):
    docker_host: str
    hf_cache: str
    kfd_topology: str
    run_all_checks: bool
    # Environment variables a recipe may pass to the server besides RECIPE_SECRETS.
    recipe_secrets: list[str]

    @field_validator("recipe_secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"an environment variable name, not {name!r}")
            if reserved_secret(name):
                raise ValueError(
                    f"a variable the model server may see; {name} is one of the tool's own credentials"
                )
        return v


class TagSettings(_Section):
    registry: str
    tag_template: str
    moving_tags: list[str]
    push_latest: bool
    cosign: bool
    # the longest `pipeline tag` waits on the registry: the push of the immutable tag (every attempt
    # together), and each registry request (then the state is read back and the run stops, exit 11)
    push_timeout_s: int = Field(ge=1)


class Settings(_Section):
    sources: SourcesSettings
    paths: PathsSettings
    image: ImageSettings
    smoke: SmokeSettings
    tag: TagSettings
    # Where each key's value came from (for the summary printed at start).
    origins: dict[str, str] = {}
    config_file: str = ""  # the project file read ("" when none)

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

    @property
    def recipe_secrets(self) -> frozenset[str]:
        """The environment variables a recipe may hand to the model server: an allow-list."""
        return frozenset((*RECIPE_SECRETS, *self.smoke.recipe_secrets))

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


def _read_toml(path: Path, hint: str | None = None) -> dict[str, Any]:
    text = read_text(path, what="configuration file", error=ConfigError, hint=hint)
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


def find_project_file(cwd: Path) -> Path | None:
    """The first `pipeline.toml` from `cwd` up to the repository root (the directory holding
    `.git`); outside a repository only `cwd` is looked at."""
    cwd = cwd.absolute()
    up = [cwd, *cwd.parents]
    root = next((d for d in up if (d / ".git").exists()), None)
    for d in up[: up.index(root) + 1] if root is not None else [cwd]:
        if (d / PROJECT_FILE).exists():  # (not is_file: a device there is refused when read)
            return d / PROJECT_FILE
    return None


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """A warning for each `PIPELINE_*` variable that is neither a setting nor in OTHER_ENV."""
    import difflib

    known = [ENV_PREFIX + k.upper() for k in KEY_SECTION] + list(OTHER_ENV)
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        out.append(
            f"environment variable {shown(name)} is not a pipeline setting and is ignored"
            + (f"; did you mean {near[0]}?" if near else " (`pipeline config` lists the settings).")
        )
    return out


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
    here = cwd or Path.cwd()

    project = config_file if config_file is not None else find_project_file(here)
    if project is not None and config_file is None and project.parent != here.absolute():
        # found above the working directory: its directory is the project's root
        for key, value in merged["paths"].items():
            if isinstance(value, str):
                merged["paths"][key] = _from(project.parent, value)
    if project is not None:  # a device or pipe is refused by the bounded read, not ignored
        data = _read_toml(project, hint="Check the --config path." if config_file is not None else None)
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
                if section == "paths" and config_file is None and isinstance(value, str):
                    value = _from(project.parent, value) if project.parent != here.absolute() else value
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
        file = str(project) if project is not None else ""
        return Settings.model_validate({**merged, "origins": origins, "config_file": file})
    except ValidationError as e:
        raise ConfigError(_describe_validation(e, origins)) from e


def _from(root: Path, value: str) -> str:
    """A relative path setting taken from `root` (empty and `~` paths are left as they are)."""
    if not value or value.startswith("~") or Path(value).is_absolute():
        return value
    return str(root / value)


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
