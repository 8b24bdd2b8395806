"""Static ATOM × aiter API compatibility check (no checkout, no import, no torch).

run_check(atom, atom_rev, aiter, aiter_rev, *, baseline_aiter_rev=None, cache_dir=None) -> CheckReport
search_compatible(atom, atom_rev, aiter, aiter_head, *, cache_dir=None) -> SearchResult
"""

from typing import TYPE_CHECKING, Any

from pipeline.compat.checker import run_check
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable
from pipeline.lazyattr import lazy_attrs

if TYPE_CHECKING:
    from pipeline.compat.search import SearchResult, search_compatible


# The search is imported by `pin --auto` only (start-up).
_lazy = lazy_attrs(__name__, {"SearchResult": "search", "search_compatible": "search"})


def __getattr__(name: str) -> Any:
    return _lazy(name)


__all__ = [
    "CauseInfo",
    "CheckReport",
    "Finding",
    "SearchResult",
    "UncheckedCall",
    "Unparseable",
    "run_check",
    "search_compatible",
]
