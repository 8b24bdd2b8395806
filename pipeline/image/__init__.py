"""image: render a build context, build it, and check the image it gives.

`context` (the rendered context: layout, manifest, candidate tag, the model's shared directory
and its lock), `dockerfile` (the Jinja environment, its quoting filters, the template values),
`render` (planning and exporting the trees into a context), `build` (the candidate: found on
the engine or in the registry, else built, self-checked and pushed), `buildprogress`,
`selfcheck`, `provenance`, `parity`.

May import `oci`, `recipes`, the top-level helpers, and from the stage libraries only what an
image carries (`smoke.benchfmt`, the check for the self-check); never `stages`, `commands` or
`release`. Settings are passed in, never read here.
"""
