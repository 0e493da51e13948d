"""NATS JetStream plumbing: broker factory, streams, KV, dead letters, telemetry, embedded servers."""
