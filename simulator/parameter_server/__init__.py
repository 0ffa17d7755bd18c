"""Parameter servers (seed 001): server hosts, parameter sharding, the step program of several iterations of
push, update and pull, and the summary of what the servers saw (docs/parameter_server.md)."""
