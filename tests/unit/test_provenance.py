"""The build's attestation status and build provenance, and how the verification record links them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline import labels
from pipeline.image.provenance import (
    ATTESTATIONS,
    NOT_GIVEN,
    PREDICATE_TYPE,
    PROVENANCE,
    STATEMENT_TYPE,
    build_provenance,
    record_attestations,
    write_build_attestations,
)

IMAGE_ID = "sha256:" + hashlib.sha256(b"config").hexdigest()
OTHER_ID = "sha256:" + hashlib.sha256(b"other").hexdigest()
RENDER = {
    "inputs_digest": "d" * 64,
    "base_image": "reg/base:1@sha256:" + "b" * 64,
    "atom_commit": "c" * 40,
    "labels": {
        labels.ATOM_SHA: "a" * 40,
        labels.ATOM_URL: "https://github.com/ROCm/ATOM",
        labels.AITER_SHA: "e" * 40,
        labels.AITER_URL: "https://github.com/ROCm/aiter",
        labels.PATCHES: json.dumps([{"name": "0001-x.patch", "sha256": "5" * 64}]),
        labels.PAIR_DIGEST: "7" * 64,
    },
    "dockerfiles": {"Dockerfile": "1" * 64, "Dockerfile.classic": "2" * 64},
    "inputs": {
        "wheels": {"lm_eval-0.4.13-py3-none-any.whl": "3" * 64},
        "templates": {"Dockerfile.j2": "4" * 64},
    },
}
UNSUPPORTED = "not produced: this front end makes no attestations"


def _write(run_dir: Path, image_id: str = IMAGE_ID) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    statement = build_provenance(
        image_id=image_id,
        image_ref="atom:candidate-dddd",
        render_manifest=RENDER,
        builder="buildkit (/usr/bin/docker 20.10.24)",
        selfcheck=None,
        cache_from="",
        steps=12,
        cached_steps=3,
    )
    return write_build_attestations(run_dir, builder="buildkit", unsupported=UNSUPPORTED, statement=statement)


def test_build_writes_no_slsa_says_why_and_states_its_inputs(tmp_path: Path) -> None:
    path = _write(tmp_path / "build")
    assert path.name == ATTESTATIONS
    att = json.loads(path.read_text())
    assert att["slsa_provenance"] is None and att["sbom"] is None and att["note"] == UNSUPPORTED
    st = json.loads((tmp_path / "build" / PROVENANCE).read_text())
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert "slsa" not in st["predicateType"]  # ours, not SLSA's
    assert st["subject"] == [{"name": "atom:candidate-dddd", "digest": {"sha256": IMAGE_ID[7:]}}]
    pred = st["predicate"]
    assert pred["slsa"]["level"] is None and "claims no SLSA build level" in pred["slsa"]["note"]
    assert pred["inputs_digest"] == "d" * 64 and pred["base_image"].endswith("b" * 64)
    assert pred["sources"]["atom"] == {
        "url": "https://github.com/ROCm/ATOM",
        "sha": "a" * 40,
        "patched_commit": "c" * 40,
    }
    assert pred["patches"] == [{"name": "0001-x.patch", "sha256": "5" * 64}]
    assert pred["pair_digest"] == "7" * 64 and "recipe" not in pred  # the image names no model
    assert pred["wheels"] == {"lm_eval-0.4.13-py3-none-any.whl": "3" * 64}
    assert pred["dockerfiles"]["Dockerfile"] == "1" * 64
    assert (
        att["build_provenance"]["sha256"]
        == hashlib.sha256((tmp_path / "build" / PROVENANCE).read_bytes()).hexdigest()
    )


def test_record_links_the_provenance_of_this_image_only(tmp_path: Path) -> None:
    path = _write(tmp_path / "build")
    linked = record_attestations(path, IMAGE_ID)
    assert linked["slsa_provenance"] is None and linked["sbom"] is None and linked["note"] == UNSUPPORTED
    assert linked["build_provenance"]["path"] == str(tmp_path / "build" / PROVENANCE)
    assert linked["build_provenance"]["predicateType"] == PREDICATE_TYPE

    other = record_attestations(path, OTHER_ID)
    assert other["build_provenance"] is None
    assert f"not {OTHER_ID}" in other["build_provenance_note"]


def test_record_refuses_a_provenance_edited_after_the_build(tmp_path: Path) -> None:
    path = _write(tmp_path / "build")
    prov = tmp_path / "build" / PROVENANCE
    prov.write_text(prov.read_text().replace("0001-x.patch", "0001-y.patch"))
    out = record_attestations(path, IMAGE_ID)
    assert out["build_provenance"] is None and "changed after the build" in out["build_provenance_note"]


def test_record_without_the_build_says_unknown(tmp_path: Path) -> None:
    out = record_attestations(None, IMAGE_ID)
    assert out == {"slsa_provenance": None, "sbom": None, "note": NOT_GIVEN, "build_provenance": None}
    broken = tmp_path / ATTESTATIONS
    broken.write_text("{not json")
    assert record_attestations(broken, IMAGE_ID)["note"].startswith("unknown:")
