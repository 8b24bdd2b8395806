"""pipeline.validate: one check per user value, with short messages."""

from __future__ import annotations

import pytest

from pipeline import validate
from pipeline.errors import ConfigError, UsageError


@pytest.mark.parametrize("name", ["MiniMax-M3-MXFP4", "a", "x" * 100, "m.1_2-3"])
def test_good_model_names(name: str) -> None:
    assert validate.model(name) == name


@pytest.mark.parametrize("name", ["", "../x", "../../x", "a/b", "-x", ".", "x" * 101, "a b", "ü"])
def test_bad_model_names(name: str) -> None:
    with pytest.raises(UsageError, match="invalid model name"):
        validate.model(name)


def test_a_long_value_is_cut_and_its_length_said() -> None:
    with pytest.raises(UsageError) as e:
        validate.model("M" * 120_000)
    assert len(str(e.value)) < 400 and "(120000 characters)" in str(e.value)


@pytest.mark.parametrize("ref", ["main", "v1.0", "ab9eb781", "HEAD", "HEAD~2", "refs/heads/x"])
def test_good_refs(ref: str) -> None:
    assert validate.ref(ref) == ref


@pytest.mark.parametrize("ref", ["", "--upload-pack=x", "a\nb", "a..b", "x" * 300])
def test_bad_refs(ref: str) -> None:
    with pytest.raises(UsageError, match="is not a git ref"):
        validate.ref(ref)


@pytest.mark.parametrize(
    "template",
    ["{model}-{date}-atom{atom7}-aiter{aiter7}-p{patchset}", "{model}-verified", "latest", "x-{inputs7}"],
)
def test_good_tag_templates(template: str) -> None:
    assert validate.tag_template(template, setting="tag_template") == template


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("{model.zzz}", "not a valid tag template"),
        ("{model[0]}", "not a valid tag template"),
        ("{nope}", "unknown field {nope}"),
        ("{model};rm", "not a valid registry tag"),
        ("{model", "not a valid tag template"),
    ],
)
def test_bad_tag_templates_are_clean_errors(template: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate.tag_template(template, setting="tag_template")
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("ref", "registry", "repository", "digest"),
    [
        ("rocm/pytorch:1@sha256:" + "a" * 64, "docker.io", "rocm/pytorch", "sha256:" + "a" * 64),
        ("127.0.0.1:5000/x/y:t", "127.0.0.1:5000", "x/y", None),
        ("ubuntu", "docker.io", "library/ubuntu", None),
    ],
)
def test_one_image_reference_grammar(ref: str, registry: str, repository: str, digest: str | None) -> None:
    parsed = validate.image_reference(ref)
    assert (parsed.registry, parsed.repository, parsed.digest) == (registry, repository, digest)


@pytest.mark.parametrize("ref", ["base; rm -rf /", "UPPER/case", "x@sha256:short", "a:b:c", ""])
def test_bad_image_references(ref: str) -> None:
    with pytest.raises(UsageError):
        validate.image_reference(ref, what="--base-image")
