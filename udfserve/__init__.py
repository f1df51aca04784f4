"""What the server and the Spark client share: the wire contract and the discovery file.

Nothing here imports TensorFlow, PySpark or anything of ``services``: a Spark executor
imports this package on its happy path.
"""

__version__ = "0.1.0"
