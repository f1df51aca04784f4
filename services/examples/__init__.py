"""Example models for the quick start, the tests and the benchmarks."""
