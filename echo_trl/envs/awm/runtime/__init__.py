"""A live AWM scenario: its server in the sandbox (``server``, bootstrapped by ``_serve``), its verifier
(``verifier``, bootstrapped by ``_verify``), episodes on one runtime (``episode``) or on a bounded pool of
servers (``pool``), the official agent's actions carried out on an episode (``agent_turns``) and the
settings every AWM environment shares (``settings``)."""
