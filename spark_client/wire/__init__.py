"""The wire: gRPC to a model server, under one ``PredictStream`` per partition (``transport``).

A protocol is a ``Wire`` (what it and the stream say to each other: ``wire``), picked in one place
(``protocols``): udfserve's Arrow stream (``arrow_wire``, with its payloads in the node's shared
memory, ``shared_memory``) or KServe v2 (``kserve_transport``, its messages ``kserve_messages``).
Around them: the worker's channels and what a server says of a model (``channels``), and what the
client proves to a server (``credentials``).

Imports only ``common``.
"""
