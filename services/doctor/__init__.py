"""``udfserve doctor``: what stands between this host and a job that uses its node, in plain words.

Run on a node, or in an executor's environment, it reads what the node and the client read
(the discovery file, the sockets, the shared-memory folder, the token, the Python that Spark's
workers start) through the very functions they use, and reports each finding with the fix for
each problem. One module per group of checks; ``report.py`` holds the report's model and
``render.py`` its text and JSON forms.
"""
