"""Static ATOM × aiter API compatibility check (no checkout, no import, no torch).

run_check(atom, atom_rev, aiter, aiter_rev, *, baseline_aiter_rev=None, cache_dir=None) -> CheckReport
search_compatible(atom, atom_rev, aiter, aiter_head, *, cache_dir=None) -> SearchResult
"""

from pipeline.compat.engine import run_check
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable
from pipeline.compat.search import SearchResult, search_compatible

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
