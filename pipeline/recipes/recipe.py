"""Model recipes: what `pipeline smoke` runs, transcribed from ATOM's own recipes.

A recipe is a YAML file (``recipes/<model>.yaml``) validated against a strict
schema: the model, the GPUs it needs, the server command and its environment,
the container options, the readiness limit and the checks (a chat completion,
GSM8K through ``lm_eval``, the serving benchmark) with their reference figures.

Commands are argv lists; ``${name}`` placeholders are filled in by the smoke
runner (``${model}``, ``${port}``, ``${isl}``, ``${osl}``, ``${concurrency}``,
``${num_prompts}``). An invalid recipe is a ``ConfigError`` naming the file,
the key and the problem.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.config import reserved_secret
from pipeline.errors import ConfigError
from pipeline.fsutil import read_text

RECIPE_SCHEMA = "atom-image-pipeline/recipe/v1"

# Placeholders a command may use, and where they are known.
SERVER_PLACEHOLDERS = frozenset({"model", "port"})
GSM8K_PLACEHOLDERS = frozenset({"model", "port"})
BENCH_PLACEHOLDERS = frozenset({"model", "port", "isl", "osl", "concurrency", "num_prompts"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _placeholders(argv: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for arg in argv:
        for m in string.Template.pattern.finditer(arg):
            if m.group("invalid") is not None:
                raise ValueError(f"argument {arg!r} has a stray '$' (write '$$' for a literal dollar)")
            name = m.group("named") or m.group("braced")
            if name:
                names.add(name)
    return names


def _check_placeholders(argv: Iterable[str], allowed: frozenset[str]) -> None:
    unknown = _placeholders(argv) - allowed
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {', '.join('${' + u + '}' for u in sorted(unknown))}; "
            f"known here: {', '.join('${' + a + '}' for a in sorted(allowed))}"
        )


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a valid regular expression: {e}") from None


def expand(argv: Iterable[str], values: Mapping[str, object]) -> list[str]:
    """Fill ``${name}`` placeholders (validated at load time, so every name is known)."""
    subst = {k: str(v) for k, v in values.items()}
    return [string.Template(a).substitute(subst) for a in argv]


class ModelSpec(_Strict):
    id: str = Field(min_length=1, description="Hugging Face model id, e.g. amd/MiniMax-M3-MXFP4")
    revision: str | None = None
    # The `architectures[0]` of the model's config.json: the key of ATOM's model registry
    # (atom/model_engine/model_runner.py), from which the check computes the model's code path.
    architecture: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class HardwareSpec(_Strict):
    gpus: int = Field(ge=1)
    gfx: str = Field(pattern=r"^gfx[0-9a-f]{3,4}$")
    name: str = ""  # marketing name, for messages (MI355)
    # Device nodes that must exist on the engine host (tests: none).
    devices: tuple[str, ...] = ("/dev/kfd", "/dev/dri")

    @property
    def gfx_target_version(self) -> int:
        return gfx_to_target_version(self.gfx)


class ContainerSpec(_Strict):
    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    ipc_mode: str | None = None
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    network_mode: str | None = None
    shm_size: str | None = None
    # Where the engine host's Hugging Face cache is mounted in the container.
    hf_cache_mount: str = "/root/.cache/huggingface"


class ServerSpec(_Strict):
    command: tuple[str, ...] = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    health_path: str = Field(default="/health", pattern=r"^/")
    ready_timeout_s: float = Field(gt=0)
    poll_interval_s: float = Field(default=2.0, gt=0)
    # "always": a traceback in the server log fails the run at any time;
    # "startup": only until the server is ready.
    fatal_traceback: Literal["always", "startup"] = "always"
    # Regexes of exception lines this server logs harmlessly (never fatal). Empty by default.
    ignore_exceptions: tuple[str, ...] = ()
    # Interpreter inside the image used for the HTTP probes (run with `docker exec`).
    python: str = "python3"

    @field_validator("command")
    @classmethod
    def _cmd(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _check_placeholders(v, SERVER_PLACEHOLDERS)
        return v

    @field_validator("ignore_exceptions")
    @classmethod
    def _ignore(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            _compile(pattern)
        return v


class ChatCheck(_Strict):
    kind: Literal["chat"]
    name: str = "chat"
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = 0.0
    # Accepted finish_reason values, each a regex matched against the whole value.
    finish_reasons: tuple[str, ...] = Field(default=("stop", "length"), min_length=1)
    expect_regex: str | None = None
    timeout_s: float = Field(default=300, gt=0)

    @field_validator("expect_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            _compile(v)
        return v

    @field_validator("finish_reasons")
    @classmethod
    def _reasons(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            _compile(pattern)
        return v


class Gsm8kReference(_Strict):
    value: float = Field(ge=0, le=1)
    stderr: float = Field(ge=0, le=1)
    samples: int = Field(ge=1, description="documents in the validated run (GSM8K test: 1319)")
    source: str = ""


class Gsm8kCheck(_Strict):
    kind: Literal["gsm8k"]
    name: str = "gsm8k"
    # lm_eval's argv without --output_path/--limit (the runner adds them).
    command: tuple[str, ...] = Field(min_length=1)
    # Run before the command when it is missing from the image (ATOM CI does the same).
    setup: tuple[str, ...] = ()
    task: str = "gsm8k"
    metric: str = "exact_match,flexible-extract"
    reference: Gsm8kReference
    limit: int | None = Field(default=None, ge=1)  # None: the full test set
    quick_limit: int = Field(default=250, ge=1)  # --quick
    # One-sided z for the gate: value >= reference - z * sqrt(se_ref^2 + p(1-p)/n)
    z: float = Field(default=3.0, gt=0)
    timeout_s: float = Field(gt=0)

    @field_validator("command")
    @classmethod
    def _cmd(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _check_placeholders(v, GSM8K_PLACEHOLDERS)
        for flag, short in _RUNNER_SETS:
            if any(_sets(a, flag, short) for a in v):
                raise ValueError(f"must not contain {flag} (or {short}): the smoke runner sets it")
        return v


# lm_eval's options the smoke runner sets itself, with their short forms (lm_eval/_cli/run.py)
_RUNNER_SETS = (("--output_path", "-o"), ("--limit", "-L"))


def _sets(arg: str, flag: str, short: str) -> bool:
    """Whether `arg` gives lm_eval's `flag` as argparse reads it: `--output_path[=X]`, an
    abbreviation (`--output`), or the short form, alone or with its value attached (`-oX`)."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        return len(name) > 2 and flag.startswith(name)
    return arg.startswith(short)


class BenchRow(_Strict):
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    requests: int | None = None
    duration_s: float | None = None
    mean_ttft_ms: float = Field(gt=0)
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float = Field(gt=0)
    p99_tpot_ms: float | None = None
    output_throughput: float = Field(gt=0)  # output tok/s
    total_token_throughput: float | None = None


class BenchmarkCheck(_Strict):
    kind: Literal["serving-benchmark"]
    name: str = "serving-benchmark"
    command: tuple[str, ...] = Field(min_length=1)
    num_prompts_per_concurrency: int = Field(default=10, ge=1)
    # Relative tolerance: throughput >= ref*(1-t), mean TTFT/TPOT <= ref*(1+t).
    tolerance: float = Field(default=0.10, ge=0, lt=10)
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrencies: tuple[int, ...] = Field(min_length=1)  # rows run by default
    quick_concurrencies: tuple[int, ...] | None = None  # rows run with --quick (default: the first)
    reference: tuple[BenchRow, ...] = Field(min_length=1)
    timeout_s: float = Field(gt=0)  # per concurrency row

    @field_validator("command")
    @classmethod
    def _cmd(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _check_placeholders(v, BENCH_PLACEHOLDERS)
        for flag in ("--result-dir", "--result-filename"):
            if any(a == flag or a.startswith(flag + "=") for a in v):
                raise ValueError(f"must not contain {flag}: the smoke runner sets it")
        return v

    @model_validator(mode="after")
    def _rows(self) -> BenchmarkCheck:
        for conc in (*self.concurrencies, *(self.quick_concurrencies or ())):
            if self.row(conc) is None:
                raise ValueError(
                    f"concurrency {conc} (ISL {self.isl} / OSL {self.osl}) has no row in 'reference'"
                )
        return self

    def row(self, concurrency: int) -> BenchRow | None:
        for r in self.reference:
            if r.isl == self.isl and r.osl == self.osl and r.concurrency == concurrency:
                return r
        return None


Check = Annotated[ChatCheck | Gsm8kCheck | BenchmarkCheck, Field(discriminator="kind")]


class CompatWaiver(_Strict):
    """A reviewed decision that one breaking call is not on this model's path."""

    path: str = Field(min_length=1)  # ATOM file, e.g. atom/model_ops/quant_v4.py
    function: str = Field(min_length=1)  # the aiter function as the check names it
    reason: str = Field(min_length=10)  # why it cannot affect this model; shown in every report
    # The conditions the call's file is reached under (`if self.use_triton`), as reach reports
    # them: the waiver holds only while every way to the call passes one of them.
    when: tuple[str, ...] = ()


class CompatPolicy(_Strict):
    waive: tuple[CompatWaiver, ...] = ()


class Recipe(_Strict):
    schema_: Literal["atom-image-pipeline/recipe/v1"] = Field(alias="schema")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    source: str = ""  # where it was transcribed from
    model: ModelSpec
    hardware: HardwareSpec
    container: ContainerSpec = ContainerSpec()
    environment: dict[str, str] = {}
    # Names of environment variables passed from the caller's environment to the
    # server container only (never logged, never in reports or labels).
    secrets: tuple[str, ...] = ("HF_TOKEN",)
    server: ServerSpec
    checks: tuple[Check, ...] = Field(min_length=1)
    # Breaking calls the static check may let through for this model (never silently).
    compat: CompatPolicy = CompatPolicy()

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if reserved_secret(key):
                raise ValueError(
                    f"{key} is one of the pipeline's own credentials (PIPELINE_*, registry and signing "
                    "variables): it goes to the push and the registry API only, never to the model server"
                )
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return v

    @model_validator(mode="after")
    def _unique(self) -> Recipe:
        names = [c.name for c in self.checks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"check names must be unique; repeated: {', '.join(dupes)}")
        clash = sorted(set(self.secrets) & set(self.environment))
        if clash:
            raise ValueError(
                f"{', '.join(clash)} listed in both 'secrets' and 'environment': secrets come from "
                "the caller's environment only, never from the recipe file"
            )
        return self


# -- gfx names <-> KFD gfx_target_version ---------------------------------------


def gfx_to_target_version(gfx: str) -> int:
    """gfx950 -> 90500, gfx942 -> 90402, gfx90a -> 90010 (KFD's encoding)."""
    digits = gfx.removeprefix("gfx")
    major, minor, step = digits[:-2], digits[-2], digits[-1]
    return int(major) * 10000 + int(minor, 16) * 100 + int(step, 16)


def target_version_to_gfx(version: int) -> str:
    major, rest = divmod(version, 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor:x}{step:x}"


# -- loading -------------------------------------------------------------------


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader (libyaml's parser when built with it) that refuses duplicate keys (PyYAML silently
    keeps the last)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("chat", "gsm8k", "serving-benchmark"):
            continue  # discriminator tag pydantic inserts into the path
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _tuples(data: Any) -> Any:
    """YAML sequences become tuples (the strict schema takes immutable sequences only)."""
    if isinstance(data, list):
        return tuple(_tuples(x) for x in data)
    if isinstance(data, dict):
        return {k: _tuples(v) for k, v in data.items()}
    return data


def load_yaml(text: str, path: Path | str, what: str = "recipe") -> Any:
    """The YAML document in `text`, refusing aliases (`*name`): an alias bomb expands a few bytes
    into gigabytes, and no recipe needs one."""
    try:
        for event in yaml.parse(text, Loader=_UniqueKeyLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark is not None else "?"
                raise ConfigError(
                    f"{what} {path}:{line}: YAML alias *{event.anchor} refused (aliases are not "
                    "allowed in a recipe).",
                    hint="Write the value out in full where the alias stood.",
                )
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(
            f"{what} {path} is not valid YAML: {e}.", hint="Fix the file and run again."
        ) from None


def _line(text: str, loc: tuple[int | str, ...]) -> int | None:
    """The line of the value at `loc` in the recipe's YAML (aliases are refused before this)."""
    try:
        node = yaml.compose(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError:
        return None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            if found is None:
                continue  # a tag pydantic inserts into the path (the check's kind)
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
    return node.start_mark.line + 1 if node is not None else None


def parse_recipe(
    text: str, path: Path | str = "<recipe>", *, allowed_secrets: frozenset[str] | None = None
) -> Recipe:
    """Validate a recipe. With `allowed_secrets` (`Settings.recipe_secrets`), every name under
    `secrets:` must be in it: a recipe may hand the model server only what the configuration allows."""
    data = load_yaml(text, path)
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: expected a mapping at the top level, got {type(data).__name__}.")
    raw_secrets = data.get("secrets")
    for k, name in enumerate(raw_secrets if isinstance(raw_secrets, list) else []):
        if isinstance(name, str) and reserved_secret(name):
            raise ConfigError(
                f"recipe {path}:{_line(text, ('secrets', k))}: secrets[{k}]: {name} is one of the "
                "pipeline's own credentials (PIPELINE_*, registry and signing variables): they go to the "
                "push and the registry API only, never to the model server.",
                hint="Remove it from the recipe's `secrets:`.",
            )
    try:
        recipe = Recipe.model_validate(_tuples(data))
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = _loc(tuple(err["loc"]))
            line = _line(text, tuple(err["loc"])) if err["loc"] and err["type"] != "missing" else None
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = (
                "" if isinstance(got, dict | list | tuple) or err["type"] == "missing" else f" (got {got!r})"
            )
            problems.append(f"{where}: {msg}{shown}" + (f" (line {line})" if line else ""))
        raise ConfigError(
            f"recipe {path} is invalid: " + "; ".join(problems) + ".",
            hint="Fix the key(s) named above; the schema is documented in docs/smoke.md.",
        ) from None
    if allowed_secrets is not None:
        for k, name in enumerate(recipe.secrets):
            if name not in allowed_secrets:
                raise ConfigError(
                    f"recipe {path}:{_line(text, ('secrets', k))}: secret {name} is not one a recipe may "
                    f"pass to the model server (allowed: {', '.join(sorted(allowed_secrets))}).",
                    hint="Remove it from `secrets:`, or, if the server truly needs it, add it to [smoke] "
                    "recipe_secrets in pipeline.toml.",
                )
    return recipe


def load_recipe(path: Path, *, allowed_secrets: frozenset[str] | None = None) -> Recipe:
    """Read and validate a recipe file; `ConfigError` names the file, key and problem.

    Callers that hand the recipe's secrets to a server pass `allowed_secrets`."""
    text = read_text(Path(path), what="recipe", error=ConfigError)
    return parse_recipe(text, path, allowed_secrets=allowed_secrets)


def find_recipe(model: str, recipes_dir: Path) -> Path:
    """`recipes/<model>.yaml`, or a ConfigError listing the recipes that exist."""
    for suffix in (".yaml", ".yml"):
        candidate = recipes_dir / f"{model}{suffix}"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in recipes_dir.glob("*.y*ml")) if recipes_dir.is_dir() else []
    if known:
        import difflib

        near = difflib.get_close_matches(model, known, n=1, cutoff=0.6)
        said = f" (known: {', '.join(known)})." + (f" Did you mean {near[0]}?" if near else "")
    elif recipes_dir.is_dir():
        said = f" ({recipes_dir.absolute()} has no recipes)."
    else:
        said = f" ({recipes_dir.absolute()} does not exist)."
    raise ConfigError(
        f"no recipe for model {model!r} in {recipes_dir}" + said,
        hint="Run from the project's directory (or one below it, where a pipeline.toml above is "
        "found), pass --recipe FILE, or set [paths] recipes_dir.",
    )
