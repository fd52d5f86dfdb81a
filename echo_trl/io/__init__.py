"""Durable files: atomic file and directory replacement (``atomic``), output directories checked and swapped
under a lock (``outputs``), resumable JSONL directories (``jsonl_store``), strict JSON in and out
(``strict_json``).

Imports nothing of echo_trl but ``errors``.
"""
