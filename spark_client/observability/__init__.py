"""What the client says of itself: the Spark job each request belongs to (``job_context``), the
trace header a task sends (``tracing``), and what each task did, summed in the driver (``stats``).

Imports ``wire`` (a stream's counters, the call metadata) and ``common``.
"""
