"""udfserve: GPU-resident model servers for Spark UDFs.

Everything udfserve installs lives under this namespace:

- ``udfserve.spark_client`` (the repository's ``spark_client/``): the UDFs that run in Spark;
- ``udfserve.services`` (the repository's ``services/``): the model server, the node supervisor, the
  ``udfserve`` command;
- the modules directly in this package: what both sides share, the wire contract, the discovery
  file, and the model runtime (``runtime``) that the server and the client's CPU fallback both run.

This module imports nothing: a Spark executor imports the namespace on its happy path, and the
shared modules import neither PySpark, nor anything of ``services`` or ``spark_client``, nor
TensorFlow (only ``runtime.backends`` does, when a model is loaded).
"""

__version__ = "0.1.0"
