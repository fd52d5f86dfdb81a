"""echo_trl: ECHO (GRPO on action tokens + lambda * cross-entropy on environment-output tokens) for TRL.

Heavy imports (torch, TRL) happen on first use of the names that need them, so the data path
and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: The public names, each with the module (under ``echo_trl``) that defines it: imported on first use.
_EXPORTS = {
    "Role": "roles",
    "Trajectory": "roles",
    "EchoTrlError": "errors",
    "EpisodeError": "errors",
    "TemplateError": "errors",
    "DatasetSchemaError": "errors",
    "awm_episode_to_trajectory": "data.readers.records",
    "load_awm_episodes": "data.readers.records",
    "build_awm_dataset": "data.build",
    "load_echo_dataset": "data.store",
    "FEATURES": "data.schema",
    "tokenize_with_roles": "tokens.tokenization",
    "RoleTokens": "tokens.tokenization",
    "EchoGRPOConfig": "config",
    "EchoGRPOTrainer": "trainer",
    "EchoSFTConfig": "sft_config",
    "EchoSFTTrainer": "sft_trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'echo_trl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
