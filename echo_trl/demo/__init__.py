"""The CPU demo of ``echo-trl train`` (ECHO vs lambda = 0 on a tiny local model): not part of the library core."""
