"""Static ATOM × aiter API compatibility check (no checkout, no import, no torch)."""

from pipeline.compat.engine import run_check
from pipeline.compat.report import CauseInfo, CheckReport, Finding, UncheckedCall, Unparseable

__all__ = ["CauseInfo", "CheckReport", "Finding", "UncheckedCall", "Unparseable", "run_check"]
