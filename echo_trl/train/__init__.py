"""What the trainer runs per batch: collation, masks, advantages, world term, metrics; TRL internals in trl_compat."""
