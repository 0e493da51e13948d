"""Placement solver service."""
