"""Topology-aware gang placement: greedy and CP-SAT."""
