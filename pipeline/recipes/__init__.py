"""recipes: the model recipe and its upstream source.

`recipe` (our YAML recipe, validated), `upstream` (ATOM's markdown recipes imported as ours),
`drift` (what changed upstream since a recipe was imported).

May import the top-level helpers, and `compat.reach` for ATOM's model registry; nothing of
images, releases, stages or the CLI.
"""
