"""What the server reports about itself: Prometheus metrics, NVML GPU gauges, and the Triton-style
per-model statistics the KServe protocol answers."""
