"""Intake service: validates and accepts jobs."""
