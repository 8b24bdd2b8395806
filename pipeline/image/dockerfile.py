"""The Dockerfile: the Jinja environment, its quoting filters and the template values.

Safety: the template environment refuses any `{{ value }}` that did not go
through one of our quoting filters (`sh`, `dq`, `path`, `image`, `cmd`,
`comment`); each filter validates its value first. A value such as
`main; rm -rf /` therefore ends up inside quotes or is refused, never run.
"""

from __future__ import annotations

import json
import re
import shlex
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import RenderError, sentence
from pipeline.fsutil import sha256_file
from pipeline.image.context import WHEELS

if TYPE_CHECKING:  # imported lazily: `build` on unchanged inputs reads only the manifest
    import jinja2


TEMPLATE = "Dockerfile.j2"


NOT_AN_INPUT = "parity.toml"  # the reviewed parity list sits beside the template; it changes no image


class Quoted(str):
    """A string a filter has validated and quoted for its place in the Dockerfile."""

    __slots__ = ()


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


_PATH = re.compile(r"^[A-Za-z0-9._/+@-]+$")


URL_CHARS = r"[^\s'\"\\`$;|&<>(){}]+"


VERSION_RE = re.compile(
    r"^[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc|\.post|\.dev)[0-9]+)*(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?$"
)


def _text(value: Any, what: str) -> str:
    import jinja2

    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RenderError(f"template value for {what} is a {type(value).__name__}, expected text.")
    return str(value)


def _no_control(value: str, what: str) -> str:
    if _CONTROL.search(value):
        raise RenderError(
            f"{what} {value!r} contains a newline or control character, which could inject "
            "Dockerfile instructions; it is refused.",
            hint="Fix the value in the lock file or configuration.",
        )
    return value


def f_sh(value: Any) -> Quoted:
    """One shell word, for RUN lines: validated (no control chars), then shlex-quoted."""
    text = _no_control(_text(value, "a shell word"), "shell value")
    return Quoted(shlex.quote(text))


def f_dq(value: Any) -> Quoted:
    """A Dockerfile double-quoted string (LABEL, ENV): `\\`, `"` and `$` escaped."""
    text = _no_control(_text(value, "a quoted string"), "label/env value")
    return Quoted('"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"')


def f_path(value: Any) -> Quoted:
    """A path in COPY/WORKDIR/RUN: only plain path characters, no quoting needed."""
    text = _text(value, "a path")
    if not _PATH.match(text) or ".." in text.split("/"):
        raise RenderError(f"path {text!r} has characters not allowed in the Dockerfile (or '..').")
    return Quoted(text)


def f_image(value: Any) -> Quoted:
    """A base image pinned by digest: `name[:tag]@sha256:<64 hex>` (the one grammar, pipeline.oci.ref)."""
    from pipeline.errors import UsageError
    from pipeline.oci.ref import parse_image_ref

    text = _text(value, "an image reference")
    try:
        ref = parse_image_ref(text)
    except UsageError as e:
        raise RenderError(f"base image: {e.message}", hint=e.hint) from None
    if not ref.digest:
        raise RenderError(
            f"base image {text!r} is not pinned by digest (name@sha256:...).",
            hint="Run `pipeline pin` where the registry answers so the lock records the base image digest.",
        )
    return Quoted(text)


def f_cmd(value: Any) -> Quoted:
    """A build command from configuration, placed verbatim after RUN.

    It is shell by design (the release engineer writes it, as upstream does);
    it must be one line, so it cannot add Dockerfile instructions.
    """
    text = _no_control(_text(value, "a build command"), "build command").strip()
    if not text or text.endswith("\\"):
        raise RenderError(f"build command {text!r} is empty or ends with a line continuation.")
    return Quoted(text)


def f_comment(value: Any) -> Quoted:
    """Free text after `#`: one line only."""
    return Quoted(_no_control(_text(value, "a comment"), "comment text"))


def f_json(value: Any) -> str:
    """JSON text (compact, sorted): feed it to `dq` or `sh` next."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


FILTERS: dict[str, Callable[[Any], Any]] = {
    "sh": f_sh,
    "dq": f_dq,
    "path": f_path,
    "image": f_image,
    "cmd": f_cmd,
    "comment": f_comment,
    "tojson_c": f_json,
}


def _finalize(value: Any) -> Any:
    import jinja2

    if isinstance(value, Quoted):
        return value
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    raise RenderError(
        f"the template puts {str(value)[:60]!r} into the Dockerfile without a quoting filter.",
        hint="Pass every value through one of: " + ", ".join(k for k in FILTERS if k != "tojson_c") + ".",
    )


def make_environment(templates_dir: Path) -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters.update(FILTERS)
    return env


def template_sources(templates_dir: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under the templates directory."""
    if not templates_dir.is_dir():
        raise RenderError(
            f"templates directory {templates_dir} does not exist.",
            hint="Set [paths] templates_dir (or PIPELINE_TEMPLATES_DIR) to the dockerfiles/ directory.",
        )
    out = {}
    for p in sorted(templates_dir.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.name != NOT_AN_INPUT:
            out[p.relative_to(templates_dir).as_posix()] = sha256_file(p)
    if TEMPLATE not in out:
        raise RenderError(f"templates directory {templates_dir} has no {TEMPLATE}.")
    return out


def dockerfile_values(values: Mapping[str, Any], *, buildkit: bool) -> dict[str, Any]:
    """The template values for one of the two Dockerfiles (BuildKit or classic)."""
    wheels = values["wheels_in_image"]
    return {
        **values,
        "buildkit": buildkit,
        "builder_name": "BuildKit" if buildkit else "classic builder",
        "pip_cache_mount": Quoted(
            "--mount=type=cache,target=/root/.cache/pip,id=atom-image-pip,sharing=locked"
        ),
        "wheels_mount": Quoted(f"--mount=type=bind,from={WHEELS},target={f_path(wheels)}"),
        "secret_mounts": Quoted(
            "".join(f"--mount=type=secret,id={f_sh(s)},required=true " for s in values["build_secrets"])
        ),
    }


def render_dockerfile(
    templates_dir: Path, values: Mapping[str, Any], template: str = TEMPLATE, *, buildkit: bool = True
) -> str:
    """Render `template` (the BuildKit Dockerfile, or with `buildkit=False` the classic one);
    template errors become RenderError naming file and line."""
    import jinja2

    if "buildkit" not in values:
        values = dockerfile_values(values, buildkit=buildkit)
    env = make_environment(templates_dir)
    try:
        return env.get_template(template).render(**values)
    except jinja2.TemplateSyntaxError as e:
        where = _where(templates_dir, e.filename or e.name or template, e.lineno)
        raise RenderError(
            sentence(f"template syntax error at {where}: {e.message}"),
            hint="Fix the template and render again.",
        ) from e
    except jinja2.TemplateNotFound as e:
        raise RenderError(f"template {e.name} not found in {templates_dir}.") from e
    except jinja2.UndefinedError as e:
        raise RenderError(
            sentence(f"template value missing at {_tb_where(e, templates_dir)}: {e.message}"),
            hint="Every value the template uses must be provided (StrictUndefined): fix the template "
            "or the render code.",
        ) from e
    except RenderError as e:
        raise RenderError(f"{e.message} (at {_tb_where(e, templates_dir)})", hint=e.hint) from e


def _where(templates_dir: Path, filename: str, lineno: int | None) -> str:
    p = Path(filename)
    if not p.is_absolute():
        p = templates_dir / p
    return f"{p}:{lineno}" if lineno else str(p)


def _tb_where(exc: BaseException, templates_dir: Path) -> str:
    root = str(templates_dir.resolve())
    found = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if str(Path(fr.filename).resolve()).startswith(root):
            found = f"{fr.filename}:{fr.lineno}"
    return found or str(templates_dir)
