"""Queueing and preemption policy: quotas, fair share, backfill, victim choice."""
