"""Offline mode: recorded trajectories, their behaviour log-probs, collation and advantages."""
