"""What an AWM scenario is: its files (``source``: gen_*.jsonl from a directory or the Hub), its initial
database (``database``) and the rewards of its outcomes (``rewards``, the upstream OpenEnv server's rules).
Nothing here starts a process."""
