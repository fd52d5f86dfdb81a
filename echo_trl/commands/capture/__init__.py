"""``echo-trl capture``: its flags, its local run, and the sub-command itself."""
