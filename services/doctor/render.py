"""The report as a person reads it (grouped, wrapped, each problem's fix under it) and as JSON."""

from __future__ import annotations

import textwrap

from udfserve.services.doctor.report import GROUP_TITLES, Finding, Report

WIDTH = 100
MARKS = {"ok": "ok", "info": "info", "warn": "WARN", "fail": "FAIL"}
INDENT = " " * 8


def render_json(report: Report) -> str:
    return report.model_dump_json(indent=2) + "\n"


def render_text(report: Report) -> str:
    lines = [
        f"udfserve doctor on {report.host}, as {report.user}: udfserve {report.udfserve_version}, "
        f"Python {report.python}",
    ]
    for group, title in GROUP_TITLES.items():
        findings = report.in_group(group)
        if not findings:
            continue
        lines += ["", title]
        for finding in findings:
            lines += _finding_lines(finding)
    lines += ["", _verdict(report)]
    return "\n".join(lines) + "\n"


def _finding_lines(finding: Finding) -> list[str]:
    head = f"  {MARKS[finding.status]:<5} "
    lines = textwrap.wrap(
        f"{finding.name}: {finding.summary}",
        WIDTH,
        initial_indent=head,
        subsequent_indent=INDENT,
        break_on_hyphens=False,
        break_long_words=False,
    )
    if finding.fix:
        lines += textwrap.wrap(
            f"fix: {finding.fix}",
            WIDTH,
            initial_indent=INDENT,
            subsequent_indent=INDENT + "     ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    return lines


def _verdict(report: Report) -> str:
    counts = report.counts
    warnings = f"{counts['warn']} warning{'s' if counts['warn'] != 1 else ''}"
    blocking = report.blocking()
    if not blocking:
        return f"Healthy: nothing blocks jobs ({warnings}). Exit code {report.exit_code}."
    names = ", ".join(f"{finding.name}" for finding in blocking)
    problems = "1 problem blocks" if len(blocking) == 1 else f"{len(blocking)} problems block"
    return f"Not healthy: {problems} jobs ({names}); {warnings}. Exit code {report.exit_code}."
