"""Preemption service."""
