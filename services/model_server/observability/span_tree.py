"""A trace as a tree of text, from the JSON lines of ``UDFSERVE_TRACING_SPANS_FILE``.

    python -m udfserve.services.model_server.observability.span_tree spans.jsonl [--trace ID]

For a look at one trace without a collector: each span on a line under its parent, in the
order they started, with its duration, and for a batch the requests it merged (its links).
Reads JSON only: no OpenTelemetry needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

SHOWN_ATTRIBUTES = (
    "udfserve.model",
    "udfserve.request_id",
    "udfserve.rows",
    "udfserve.batch.rows",
    "udfserve.batch.requests",
    "spark.stage_id",
    "spark.partition_id",
    "rpc.grpc.status",
)


def load_spans(path: Path) -> list[dict[str, Any]]:
    """Every span of a spans file (one JSON object a line, ``ReadableSpan.to_json``)."""
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def trace_id(span: dict[str, Any]) -> str:
    """The span's trace id, 32 hex digits."""
    return str(span["context"]["trace_id"]).removeprefix("0x")


def span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"]).removeprefix("0x")


def parent_id(span: dict[str, Any]) -> str | None:
    parent = span.get("parent_id")
    return None if parent is None else str(parent).removeprefix("0x")


def duration_ms(span: dict[str, Any]) -> float:
    start, end = (
        datetime.fromisoformat(span[key].replace("Z", "+00:00")) for key in ("start_time", "end_time")
    )
    return (end - start).total_seconds() * 1e3


def render(spans: Iterable[dict[str, Any]], trace: str) -> str:
    """The spans of ``trace`` as an indented tree; a span whose parent is not among them (the
    client's, which the server does not export) is shown under that parent's id."""
    members = [span for span in spans if trace_id(span) == trace]
    ids = {span_id(span) for span in members}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for span in members:
        children[parent_id(span)].append(span)
    for group in children.values():
        group.sort(key=lambda span: span["start_time"])
    lines = [f"trace {trace}"]
    for parent, roots in sorted(children.items(), key=lambda item: item[0] or ""):
        if parent in ids:
            continue
        lines.append(f"└── (span {parent}: the client's, not exported by the server)" if parent else "")
        indent = "    " if parent else ""
        for root in roots:
            _render_span(root, children, indent, lines)
    return "\n".join(line for line in lines if line) + "\n"


def _render_span(
    span: dict[str, Any], children: dict[str | None, list[dict[str, Any]]], indent: str, lines: list[str]
) -> None:
    attributes = span.get("attributes") or {}
    shown = " ".join(
        f"{key.split('.')[-1]}={attributes[key]}" for key in SHOWN_ATTRIBUTES if key in attributes
    )
    links = span.get("links") or []
    linked = f" links={len(links)}" if links else ""
    lines.append(f"{indent}├── {span['name']}  {duration_ms(span):.3f} ms  {shown}{linked}".rstrip())
    for child in children.get(span_id(span), []):
        _render_span(child, children, indent + "│   ", lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spans_file", type=Path)
    parser.add_argument("--trace", help="the trace id (32 hex digits); default: the first span's trace")
    args = parser.parse_args(argv)
    spans = load_spans(args.spans_file)
    if not spans:
        sys.stderr.write(f"{args.spans_file} holds no span\n")
        return 1
    sys.stdout.write(render(spans, args.trace or trace_id(spans[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
