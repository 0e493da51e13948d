"""Trace simulator driving the same placement and queueing code as the live services."""
