"""Redis gang reservations: one Lua commit, leases, fencing tokens."""
