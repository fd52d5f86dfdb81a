"""Prefix sharing: a micro-batch as a prefix tree, an epoch order that keeps prefixes together, tree attention."""
