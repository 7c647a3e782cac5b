"""sim/cost."""
