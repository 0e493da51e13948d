"""Node executor service."""
