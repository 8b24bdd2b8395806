"""The `PIPELINE_*` environment variables and where configuration is read from.

Light on purpose (no pydantic): `pipeline --help` lists them, and `pipeline.config`
warns about the `PIPELINE_*` variables that are none of them.
"""

from __future__ import annotations

from pathlib import Path

ENV_PREFIX = "PIPELINE_"
PROJECT_FILE = "pipeline.toml"

# PIPELINE_* variables that are not settings: name -> what it does
OTHER_ENV: dict[str, str] = {
    "PIPELINE_REGISTRY_USER": "registry user (with PIPELINE_REGISTRY_PASSWORD) for pushes and digests",
    "PIPELINE_REGISTRY_PASSWORD": "registry password or token (masked in every log)",
    "PIPELINE_REPLAY": "0: a repeated plain `pipeline check` runs again instead of replaying its result",
}

SOURCES = (
    "Lowest first: packaged defaults; the project file (--config FILE, else the first "
    f"{PROJECT_FILE} from the working directory up to the repository root); {ENV_PREFIX}<KEY> "
    "variables; flags. `pipeline config` shows each value and where it came from."
)


def settings_by_section() -> dict[str, list[str]]:
    """{section: [key, ...]} of the packaged defaults (every setting has one)."""
    import tomllib  # (here: a plain check imports this module and never reads the defaults)

    text = (Path(__file__).parent / "defaults.toml").read_text(encoding="utf-8")  # no import: fast --help
    return {section: list(values) for section, values in tomllib.loads(text).items()}
