"""The per-node supervisor (``udfserve node``): one model server per device, a discovery file
the Spark client reads, restarts with back-off, a Prometheus targets file. See docs/node.md.
"""
