"""What every room of the client stands on: the settings a UDF carries (``config``, and in it the
node a task makes sure of, ``node_start``), what the client knows of a model (``model_spec``, and
the rules of the version column, ``versions``), and the errors a Spark task fails with (``errors``).

Imports no other room of the client.
"""
