"""What one training step computes, checks and logs: the world term, finiteness, precision, metrics."""
