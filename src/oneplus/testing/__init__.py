"""Harnesses that test a running platform from outside: the chaos run and the multi-host lab.

Not imported by the platform itself; `python -m oneplus.chaos` / `python -m oneplus.multihost` (`task chaos`,
`task multihost`) still start them."""
