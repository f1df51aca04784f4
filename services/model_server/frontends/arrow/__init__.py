"""udfserve's own protocol: a bidirectional stream of Arrow IPC batches, inline or in the node's
shared memory."""
