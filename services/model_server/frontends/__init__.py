"""The server's front ends: each decodes its protocol's requests and encodes its answers, and
hands every request to the one lifecycle in ``core``.

``arrow/`` the Arrow IPC Predict stream (and the node's shared memory), ``kserve/`` the KServe v2
protocol (the python servicer, and the compiled grpc++ front end with its bridge), ``http_api``
the admin app (health, model listing, ``/metrics``; its thread ``admin_server``, its limits
``admin_limits``, its page ``metrics_page``), ``streaming`` what both stream protocols share.
"""
