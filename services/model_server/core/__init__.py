"""The request core every front end shares: the request lifecycle (admission, in-flight count,
answer, observation), the model table, and one dynamic batcher per model."""
