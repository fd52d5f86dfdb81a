"""What plays an episode for ``echo-trl capture``: the policy protocol (``policy``), replayed scripts and
recordings (``replay``, checked by ``replay_check``), a local model (``model``) and a model behind an
OpenAI-compatible server (``openai``, its responses read by ``sampled``)."""
