"""Cluster topology model and parsers (nvidia-smi topo -m, NVML, cluster YAML)."""
