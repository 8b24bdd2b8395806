"""release: tag a verified image, move its moving tags, keep the verification record.

`tag` (a verdict bound to one image, pushed under an immutable tag), `moving_tags` (forward
only, rolled back together), `record` (the signed-or-not statement of what was released).

May import `oci`, `image` (the provenance it links), `smoke.verdict` and the top-level helpers;
never `stages` or `commands`.
"""
