"""What several commands share: loading by name, launch checks, checkpoints, the training run."""
