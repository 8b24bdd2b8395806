"""oci: the Docker engine, BuildKit and OCI registries, each wrapped once.

`engine` (the engine API: build, run, pull, push, tag; errors keep their evidence),
`buildkit` (the docker CLI's BuildKit front end), `registry` (the registry v2 API and
credentials), `ref` (the one image-reference grammar).

May import only the top-level helpers (errors, log, retry, fsutil, validate, labels): nothing
of images, releases, stages or the CLI.
"""
