"""offers, trial (being written)."""
