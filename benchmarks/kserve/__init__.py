"""perf_analyzer against udfserve's KServe v2 endpoint and against a real Triton serving the same model."""
