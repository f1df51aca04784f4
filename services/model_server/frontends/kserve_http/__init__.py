"""The KServe v2 protocol over HTTP/REST, as Triton serves it (``--kserve-http-port``).

The HTTP binding of the protocol the gRPC front end (``frontends/kserve``) serves: the same
servicer answers both, so a request over HTTP is checked, batched, counted and refused exactly
as a ``ModelInfer`` over gRPC. This package only reads HTTP and writes it:

- ``bodies``: an inference request's JSON (and binary tensor data) read as the gRPC request, and
  an answer's tensors written as JSON or as binary tensor data;
- ``json_views``: the servicer's other answers (metadata, configuration, statistics, the
  repository index) as Triton writes them in JSON, and the HTTP status of each gRPC status;
- ``bounds``: what the port holds (requests at once, bytes of bodies) and the body's reading;
- ``routes``: the route table;
- ``listener``: the port itself, on the serving loop or on a thread of its own.
"""
