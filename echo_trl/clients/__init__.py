"""Clients of the servers echo_trl talks to: MCP (``mcp``) and OpenAI-compatible inference (``openai``).

Imports nothing of echo_trl but ``errors``: what the replies mean (turns, episodes) is the caller's.
"""
