"""Containment for generated code: bubblewrap with seccomp, rlimits, cgroups and a fresh keyring, or a refusal.

Imports nothing of echo_trl but ``errors``. ``bwrap`` (detect, refuse, spawn, kill) is the front door;
``bwrap_args`` builds its command line, ``seccomp``, ``keyring`` and ``cgroups`` are its layers, and
``hostio`` is the host side of the boundary (sealed inputs, bounded reads, no-follow removal).
"""
