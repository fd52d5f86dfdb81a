"""The seeds' terminal setting: a sandboxed shell-like environment for online ECHO (``TerminalEnv``)."""

from .env import FILES, CommandError, Shell, TerminalEnv, VirtualFS

__all__ = ["FILES", "CommandError", "Shell", "TerminalEnv", "VirtualFS"]
