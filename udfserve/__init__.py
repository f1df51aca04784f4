"""What the server and the Spark client share: the wire contract, the discovery file, and the
model runtime (``runtime``) that the server and the client's CPU fallback both run.

Nothing here imports PySpark or anything of ``services`` or ``spark_client``, and TensorFlow only
inside ``runtime.backends``, when a model is loaded: a Spark executor imports this package on
its happy path.
"""

__version__ = "0.1.0"
