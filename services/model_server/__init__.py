"""One model server process: pinned to one device, each model loaded once, batched over gRPC."""
