"""The model runtime that the model server and the Spark client's CPU fallback both run.

The repository scan (``repository``), the backends that load and call models (``backends``), the
checks and conversions between Arrow batches and tensors (``tensor_conversion``), the errors of a
model's requests (``errors``) and device pinning (``device``) live here, in the shared layer, so
the fallback computes exactly what a server computes without importing the server's package.

Importing any of it imports no framework: a backend imports its framework (TensorFlow) only when
it is asked for, to load a model.
"""
