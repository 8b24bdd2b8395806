"""The wheelhouse render links into the context must be for the image's python ([image] python_version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import RenderError
from pipeline.image.render import link_wheelhouse, wheel_pythons

PINS = (
    "lm_eval-0.4.13-py3-none-any.whl",
    "setuptools_scm-10.3.4-py3-none-any.whl",
    "pip-26.3-py3-none-any.whl",
)


def wheelhouse(dest: Path, *extra: str) -> Path:
    dest.mkdir(parents=True)
    for name in (*PINS, *extra):
        (dest / name).write_bytes(b"")
    return dest


@pytest.mark.parametrize(
    ("name", "pythons"),
    [
        ("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", {"3.11"}),
        ("numpy-2.2.0-cp310-cp310-manylinux_2_17_x86_64.whl", {"3.10"}),
        ("hf_xet-1.8.0-cp38-abi3-manylinux2014_x86_64.whl", None),  # stable ABI: any later python
        ("lm_eval-0.4.13-py3-none-any.whl", None),
        ("six-1.17.0-py2.py3-none-any.whl", None),
        ("pkg-1.0-1-cp310.cp311-cp310-linux_x86_64.whl", {"3.10", "3.11"}),  # with a build tag
    ],
)
def test_wheel_pythons_reads_the_file_name_tags(name: str, pythons: set[str] | None) -> None:
    assert wheel_pythons(name) == pythons


def test_a_wheelhouse_for_the_image_python_is_linked(tmp_path: Path) -> None:
    src = wheelhouse(tmp_path / "py3.10", "numpy-2.2.0-cp310-cp310-manylinux_2_17_x86_64.whl")
    hashes = link_wheelhouse(src, tmp_path / "ctx" / "wheels", required=True, python_version="3.10")
    assert sorted(hashes) == sorted([*PINS, "numpy-2.2.0-cp310-cp310-manylinux_2_17_x86_64.whl"])


def test_a_wheelhouse_for_another_python_is_refused_naming_the_fix(tmp_path: Path) -> None:
    src = wheelhouse(tmp_path / "py3.11", "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl")
    dest = tmp_path / "ctx" / "wheels"
    with pytest.raises(RenderError) as e:
        link_wheelhouse(src, dest, required=False, python_version="3.10")
    msg = e.value.message
    assert "holds wheels for python 3.11" in msg and "python_version is 3.10" in msg
    assert "numpy-2.4.6-cp311" in msg
    assert e.value.hint is not None and "scripts/setup.sh image-wheelhouse" in e.value.hint
    assert "python_version (3.10; it needs python3.10 on this host)" in e.value.hint
    assert not dest.exists()  # nothing half-done


def test_a_missing_wheelhouse_hint_names_the_python_of_python_version(tmp_path: Path) -> None:
    """`scripts/setup.sh wheelhouse` alone builds for the host's python: the hint names the image's
    (`image-wheelhouse` reads it from the configuration)."""
    with pytest.raises(RenderError) as e:
        link_wheelhouse(tmp_path / "none", tmp_path / "ctx" / "wheels", required=True, python_version="3.11")
    assert e.value.hint is not None and "scripts/setup.sh image-wheelhouse" in e.value.hint
    assert "python 3.11" in e.value.hint
