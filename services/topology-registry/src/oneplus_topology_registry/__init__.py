"""Topology registry service."""
