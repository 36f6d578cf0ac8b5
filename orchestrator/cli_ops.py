"""reap, reaper, cost, protect, unprotect (being written)."""
