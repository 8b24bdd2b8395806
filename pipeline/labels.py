"""Image label keys: the OCI ones and the pipeline's own.

Render writes them, smoke and tag read them to bind a verdict to its inputs.
"""

from __future__ import annotations

OCI = "org.opencontainers.image"
OCI_SOURCE = f"{OCI}.source"
OCI_REVISION = f"{OCI}.revision"
OCI_CREATED = f"{OCI}.created"
OCI_VERSION = f"{OCI}.version"
OCI_TITLE = f"{OCI}.title"
OCI_BASE_NAME = f"{OCI}.base.name"
OCI_BASE_DIGEST = f"{OCI}.base.digest"

OURS = "org.atom-image-pipeline"
ATOM_SHA = f"{OURS}.atom.sha"
ATOM_URL = f"{OURS}.atom.url"
AITER_SHA = f"{OURS}.aiter.sha"
AITER_URL = f"{OURS}.aiter.url"
PATCHES = f"{OURS}.patches"  # JSON list of {"name": ..., "sha256": ...}
# Lock.pair_digest() of the locks the image is built from: model-free, as the image is (every
# model whose lock pins the same pair shares the image; its verdict binds its lock to it)
PAIR_DIGEST = f"{OURS}.pair.digest"
INPUTS_DIGEST = f"{OURS}.inputs.digest"  # sha256 over everything that determines the image
# What images built before the image was model-free carried instead of PAIR_DIGEST (the digest of
# one model's lock); read only to tell such an image apart from one this pipeline never built.
OLD_LOCK_SHA256 = f"{OURS}.lock.sha256"
# On a smoke run's containers only, never on an image (an image serves every model of its pair).
MODEL = f"{OURS}.model"
RECIPE = f"{OURS}.recipe"  # recipe file name
TOOL_VERSION = f"{OURS}.tool.version"

# Containers a run starts (smoke server, probes): who owns them, so a later run can tell a
# leftover of a dead run (remove it) from another live run's server (never touch it).
RUN = f"{OURS}.run"  # the run's id
OWNER_HOST = f"{OURS}.owner.host"  # hostname of the machine the owning `pipeline` runs on
OWNER_PID = f"{OURS}.owner.pid"
OWNER_STARTED = f"{OURS}.owner.started"  # the owner's start time (clock ticks since boot, /proc/<pid>/stat)
OWNER_BOOT = f"{OURS}.owner.boot"  # /proc/sys/kernel/random/boot_id of that machine
OWNER_PIDNS = f"{OURS}.owner.pidns"  # the owner's PID namespace (pids compare only within one)
SERVER_PORT = f"{OURS}.smoke.port"
