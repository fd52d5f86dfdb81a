"""Live environments that produce agent episodes (beside the recorded-episode data flow).

``echo_trl.envs.awm`` runs Agent World Model scenarios locally: a SQLite database built from
the scenario's schema and sample rows, the generated FastAPI app served over MCP in a contained
subprocess, and the task's code verifier. Episodes it records enter the data flow at the top
(``echo_trl.data.records.load_awm_episodes``); its TRL environment plugs into ``environment_factory``.
"""
