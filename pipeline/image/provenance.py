"""What the build says about attestations, and the build provenance we can state honestly.

The docker CLI 20.10 front end (BuildKit v0.8 in dockerd) makes no SLSA provenance and no SBOM
attestation; the classic builder makes none either. So the build writes, into its run directory:

- `attestations.json`: which front end built the image, `slsa_provenance: null` and `sbom: null`
  with the reason (a field, never silence), and a link to:
- `provenance.json`: an in-toto Statement v1 about the built image (subject: its image ID, the
  config digest, as no registry digest exists yet) whose predicate is our own build record: the
  inputs digest, the pinned sources and base image digest, the patch series, the recipe, the
  Dockerfiles' and wheels' sha256, the front end, the self-check report. Its predicate type is
  ours (PREDICATE_TYPE), not SLSA's: it is written by the build tool itself on the build host,
  unsigned, so it claims no SLSA build level.

The verification record (pipeline.release.record) links both, after checking that the provenance's
subject is the image being tagged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline import __version__, labels
from pipeline.fsutil import atomic_write_json, sha256_file

ATTESTATIONS = "attestations.json"
PROVENANCE = "provenance.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://atom-image-pipeline.dev/build-provenance/v1"
SLSA_NOTE = (
    "not SLSA provenance: written by atom-image-pipeline itself on the build host and unsigned, so it "
    "claims no SLSA build level"
)
NOT_GIVEN = "unknown: this tag run was not given the build's attestations.json"


def _json_label(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def build_provenance(
    *,
    image_id: str,
    image_ref: str,
    render_manifest: Mapping[str, Any],
    builder: str,
    selfcheck: Path | None,
    cache_from: str,
    steps: int,
    cached_steps: int,
) -> dict[str, Any]:
    """The in-toto statement of what went into `image_id` (from the context's render.json)."""
    lab = {str(k): str(v) for k, v in dict(render_manifest.get("labels") or {}).items()}
    inputs = dict(render_manifest.get("inputs") or {})
    algo, _, hexdigest = image_id.partition(":")
    predicate: dict[str, Any] = {
        "slsa": {"level": None, "note": SLSA_NOTE},
        "builder": {"front_end": builder, "tool": {"name": "atom-image-pipeline", "version": __version__}},
        "inputs_digest": render_manifest.get("inputs_digest", ""),
        "base_image": render_manifest.get("base_image", ""),
        "sources": {
            "atom": {
                "url": lab.get(labels.ATOM_URL, ""),
                "sha": lab.get(labels.ATOM_SHA, ""),
                "patched_commit": render_manifest.get("atom_commit", ""),
            },
            "aiter": {
                "url": lab.get(labels.AITER_URL, ""),
                "sha": lab.get(labels.AITER_SHA, ""),
                "submodules": _json_label(lab.get(f"{labels.OURS}.aiter.submodules", "[]")),
            },
        },
        "patches": _json_label(lab.get(labels.PATCHES, "[]")),
        # the pinned inputs, model-free: the model and recipe an image served are its verdicts'
        "pair_digest": lab.get(labels.PAIR_DIGEST, ""),
        "dockerfiles": dict(render_manifest.get("dockerfiles") or {}),
        "templates": dict(inputs.get("templates") or {}),
        "wheels": dict(inputs.get("wheels") or {}),
        "build": {"cache_from": cache_from, "steps": steps, "cached_steps": cached_steps},
        "selfcheck": (
            {"path": str(selfcheck), "sha256": sha256_file(selfcheck)}
            if selfcheck is not None and selfcheck.is_file()
            else None
        ),
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image_ref, "digest": {algo: hexdigest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def write_build_attestations(
    run_dir: Path,
    *,
    builder: str,
    unsupported: str,
    statement: Mapping[str, Any],
    attested: Mapping[str, Any] | None = None,
) -> Path:
    """Write provenance.json and attestations.json (which links it) into `run_dir`; the latter's path.

    `attested`: where buildx pushed the image with its attestations ({ref: name@index digest,
    metadata}); they are linked there (the index holds SLSA provenance and the SPDX SBOM).
    """
    provenance = run_dir / PROVENANCE
    atomic_write_json(provenance, statement)
    path = run_dir / ATTESTATIONS
    slsa = sbom = None
    if attested is not None:
        ref = str(attested["ref"])
        slsa = {"ref": ref, "mode": "max", "metadata": dict(attested.get("metadata") or {})}
        sbom = {"ref": ref, "format": "spdx"}
        unsupported = f"buildx attached SLSA provenance (mode=max) and an SPDX SBOM to {ref}"
    atomic_write_json(
        path,
        {
            "builder": builder,
            "slsa_provenance": slsa,
            "sbom": sbom,
            "note": unsupported,
            "build_provenance": {
                "path": PROVENANCE,
                "sha256": sha256_file(provenance),
                "predicateType": PREDICATE_TYPE,
                "slsa": SLSA_NOTE,
            },
        },
    )
    return path


def record_attestations(attestations: Path | None, image_id: str) -> dict[str, Any]:
    """The `attestations` field of the verification record: what exists, and why not the rest.

    The build provenance is linked only when its file is intact (sha256) and its subject is
    `image_id`; otherwise the field says why it is not.
    """
    out: dict[str, Any] = {"slsa_provenance": None, "sbom": None, "note": NOT_GIVEN, "build_provenance": None}
    if attestations is None:
        return out
    try:
        data = json.loads(attestations.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        out["note"] = f"unknown: the build's {attestations} cannot be read ({e})"
        return out
    out["front_end"] = str(data.get("builder", ""))
    out["note"] = str(data.get("note", ""))
    for kind in ("slsa_provenance", "sbom"):  # buildx's, in the registry: linked by reference
        if isinstance(data.get(kind), dict):
            out[kind] = {k: v for k, v in data[kind].items() if k != "metadata"}
    link = data.get("build_provenance") or {}
    if not link:
        out["build_provenance_note"] = "the build wrote no build provenance"
        return out
    path = attestations.parent / str(link.get("path", PROVENANCE))
    try:
        digest = sha256_file(path)
        statement = json.loads(path.read_text(encoding="utf-8"))
        subjects = [f"sha256:{s['digest']['sha256']}" for s in statement.get("subject", [])]
    except (OSError, ValueError, KeyError, TypeError) as e:
        out["build_provenance_note"] = f"not linked: {path} cannot be read ({e})"
        return out
    if digest != link.get("sha256"):
        out["build_provenance_note"] = f"not linked: {path} changed after the build wrote it"
        return out
    if image_id not in subjects:
        out["build_provenance_note"] = (
            f"not linked: {path} is about {', '.join(subjects) or 'no image'}, not {image_id}"
        )
        return out
    out["build_provenance"] = {
        "path": str(path),
        "sha256": digest,
        "predicateType": statement.get("predicateType", ""),
        "slsa": SLSA_NOTE,
    }
    return out
