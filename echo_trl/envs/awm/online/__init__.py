"""AWM scenarios as TRL ``environment_factory`` environments for online GRPO / ECHO: one class per scenario
with a method per MCP tool (``environment``, methods from ``tools``), the official agent's two-tool
environment (``agent``) and the prompt dataset (``dataset``)."""
