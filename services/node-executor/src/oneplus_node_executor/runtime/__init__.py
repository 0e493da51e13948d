"""Runtimes the executor drives: the simulated one and a Docker-API container engine, behind one protocol."""
