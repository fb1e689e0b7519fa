"""Glue between Inductor and qlower: the custom graph pass and the decision report."""

from __future__ import annotations

from qlower.passes.qlower_pass import QLowerPass
from qlower.passes.report import Decision, Report, all_reports, clear_reports, last_report

__all__ = ["Decision", "QLowerPass", "Report", "all_reports", "clear_reports", "last_report"]
