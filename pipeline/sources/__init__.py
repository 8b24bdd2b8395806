"""Sources: bare mirrors of ATOM, aiter (and its submodules) and ref resolution.

Every repository we read is first mirrored under `settings.mirrors_dir`
(`<readable-name>-<hash>.git`, bare), then fetched incrementally. Later stages
read only from these mirrors, at the full SHAs written in the lock file, so
they never need the network. Any git URL or a local path can be a source: with
local paths (and `--offline`, or no network at all) nothing is ever fetched
from elsewhere.

One module per job (all of git itself goes through `pipeline.gitw.run_git`):

- `urls`: local path vs URL, credentials stripped, mirror names, submodule URLs
- `mirrors`: the mirror's lock, atomic creation, fetch with retries, `refs/pins/*`
- `repos`: a repository a user names: a local path as it is, else its mirror
- `refs`: branch / tag / SHA / `HEAD` resolution, nearest refs for typos
- `submodules`: aiter's submodules at a commit, mirrored best effort
- `pinning`: `pin` (both sources, submodules, base image digest); `--auto` is the pin stage's

`from pipeline.sources import X` keeps working for every name below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.lazyattr import lazy_attrs

if TYPE_CHECKING:
    from pipeline.sources.mirrors import (
        FETCHED_MARKER,
        MIRROR_LOCK_TIMEOUT,
        PIN_REF_PREFIX,
        FetchProgress,
        fetch_commit,
        keep_pinned,
        last_fetched,
        lock_path,
        mirrors_for_lock,
        open_mirror,
    )
    from pipeline.sources.pinning import (
        AiterChooser,
        DigestResolver,
        PinResult,
        default_digest_resolver,
        pin,
        pin_base_image,
    )
    from pipeline.sources.refs import nearest_refs, resolve_ref
    from pipeline.sources.repos import open_repo, repo_path
    from pipeline.sources.submodules import mirror_lock_submodules, read_submodules, submodule_mirror
    from pipeline.sources.urls import (
        is_local,
        mirror_name,
        mirror_path,
        normalise_url,
        resolve_relative_url,
        strip_credentials,
        validate_model,
    )

# name -> the module that defines it: imported on first use (a check of local repositories
# needs only `is_local`, and should not load the pin and fetch machinery).
_WHERE = {
    "FETCHED_MARKER": "mirrors",
    "MIRROR_LOCK_TIMEOUT": "mirrors",
    "PIN_REF_PREFIX": "mirrors",
    "FetchProgress": "mirrors",
    "fetch_commit": "mirrors",
    "keep_pinned": "mirrors",
    "last_fetched": "mirrors",
    "lock_path": "mirrors",
    "mirrors_for_lock": "mirrors",
    "open_mirror": "mirrors",
    "AiterChooser": "pinning",
    "DigestResolver": "pinning",
    "PinResult": "pinning",
    "default_digest_resolver": "pinning",
    "pin": "pinning",
    "pin_base_image": "pinning",
    "nearest_refs": "refs",
    "open_repo": "repos",
    "repo_path": "repos",
    "resolve_ref": "refs",
    "read_submodules": "submodules",
    "mirror_lock_submodules": "submodules",
    "submodule_mirror": "submodules",
    "is_local": "urls",
    "mirror_name": "urls",
    "mirror_path": "urls",
    "normalise_url": "urls",
    "resolve_relative_url": "urls",
    "strip_credentials": "urls",
    "validate_model": "urls",
}


_lazy = lazy_attrs(__name__, _WHERE)


def __getattr__(name: str) -> Any:
    return _lazy(name)


__all__ = [
    "FETCHED_MARKER",
    "MIRROR_LOCK_TIMEOUT",
    "PIN_REF_PREFIX",
    "AiterChooser",
    "DigestResolver",
    "FetchProgress",
    "PinResult",
    "default_digest_resolver",
    "fetch_commit",
    "is_local",
    "keep_pinned",
    "last_fetched",
    "lock_path",
    "mirror_lock_submodules",
    "mirror_name",
    "mirror_path",
    "mirrors_for_lock",
    "nearest_refs",
    "normalise_url",
    "open_mirror",
    "open_repo",
    "pin",
    "pin_base_image",
    "read_submodules",
    "repo_path",
    "resolve_ref",
    "resolve_relative_url",
    "strip_credentials",
    "submodule_mirror",
    "validate_model",
]
