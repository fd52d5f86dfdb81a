"""Online mode: ECHO's masks for TRL's generated completions and the batch's environment work."""
