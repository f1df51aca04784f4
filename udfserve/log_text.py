"""What a client sent, made safe to put in a log line.

A server logs request ids, model names, versions and Spark application names that its clients
chose. Unbounded, one client controls how fast the server's log grows (a 4 MiB request id is a
4 MiB log line per request), and raw, it can forge lines (a newline in a name). ``clip`` is the
one way such text enters a log line: at most ``limit`` characters of it, its control characters
escaped, and how long it was when it was cut.
"""

from __future__ import annotations

CLIENT_TEXT_CHARS = 200
"""Characters of one client-supplied value a log line keeps: every id and name the product
makes is shorter, so a clipped value is a bad client's."""


def clip(value: object, limit: int = CLIENT_TEXT_CHARS) -> str:
    """``value`` as text for a log line: its ``repr`` for anything but ``str``, control characters
    escaped, at most ``limit`` characters followed by ``...(N characters)`` when cut."""
    text = value if isinstance(value, str) else repr(value)
    length = len(text)
    shown = text[:limit]
    if not shown.isprintable():
        shown = shown.encode("unicode_escape").decode("ascii")
    if length > limit or len(shown) > limit:
        return f"{shown[:limit]}...({length} characters)"
    return shown


ERROR_LINE_CHARS = 300


def error_line(error: BaseException) -> str:
    """``Type: first line of its text``, clipped: what a client is told of an unexpected error,
    whose whole text (a framework's trace, server paths) stays in the server's log."""
    first = next(iter(str(error).splitlines()), "")
    return clip(f"{type(error).__name__}: {first}", ERROR_LINE_CHARS)
