"""Every GPU path of udfserve run once on a real GPU, with a figure and a verdict for each.

    bash scripts/gpu_check.sh                 # on a machine with one NVIDIA GPU
    bash scripts/gpu_check.sh --device cpu    # the dry run: the same checks, less what needs NVIDIA

The checks, each a real run (``__main__`` runs them in this order and prints one table):

- ``serve``: ``udfserve serve --device gpu:0`` serves a ``torch.export`` model and an ONNX model,
  started with every GPU hidden from its environment, so that computing on ``cuda:0`` shows that
  the server pinned ``CUDA_VISIBLE_DEVICES`` itself; the answers equal the CPU's.
- ``oom``: a batch too big for a memory cap (the PyTorch backend's CUDA cap on a GPU, an address
  space limit on the CPU) runs out of memory for real, the server splits it, every row is
  answered once and equals the answer of small requests.
- ``node``: ``udfserve node --devices auto`` finds the GPU through NVML, its discovery file lists
  it, and the server's GPU gauges carry NVML's figures.
- ``executor``: the executor's side without Spark (the client's partition path that
  ``predict_arrow`` runs) in processes that never import torch or map CUDA scores rows through
  the node's unix socket and shared memory: a small MLP, the null model (the serving path's
  ceiling), and a compute-heavy conv net against the same model in-process on the CPU and on
  the GPU, with the GPU's utilisation while the server computes.

Everything runs on the machine's own torch; TensorFlow and PySpark are not needed (the executors
refuse to import PySpark, as on a machine that has none).
"""
