"""The server side of udfserve: the per-device model server and the node supervisor."""
