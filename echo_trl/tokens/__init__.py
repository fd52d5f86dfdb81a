"""Trajectories -> token ids and per-token roles by the model's own chat template, cached; world mask, statistics."""
