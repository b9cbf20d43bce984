"""Worker processes: each owns exactly one engine and serves it over ZeroMQ."""
