"""echo_trl: ECHO (GRPO on action tokens + lambda * cross-entropy on environment-output tokens) for TRL.

Heavy imports (torch, TRL) happen on first use of the names that need them, so the data path
and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Role": "roles",
    "Trajectory": "roles",
    "EchoTrlError": "errors",
    "EpisodeError": "errors",
    "TemplateError": "errors",
    "DatasetSchemaError": "errors",
    "awm_episode_to_trajectory": "data.records",
    "load_awm_episodes": "data.records",
    "build_awm_dataset": "data.build",
    "load_echo_dataset": "data.store",
    "FEATURES": "data.schema",
    "tokenize_with_roles": "tokens.tokenization",
    "RoleTokens": "tokens.tokenization",
    "EchoGRPOConfig": "config",
    "EchoGRPOTrainer": "trainer",
}

__all__ = [
    "DatasetSchemaError",
    "EchoGRPOConfig",
    "EchoGRPOTrainer",
    "EchoTrlError",
    "EpisodeError",
    "FEATURES",
    "Role",
    "RoleTokens",
    "TemplateError",
    "Trajectory",
    "awm_episode_to_trajectory",
    "build_awm_dataset",
    "load_awm_episodes",
    "load_echo_dataset",
    "tokenize_with_roles",
]

if TYPE_CHECKING:  # pragma: no cover
    from .config import EchoGRPOConfig
    from .data.build import build_awm_dataset
    from .data.records import awm_episode_to_trajectory, load_awm_episodes
    from .data.schema import FEATURES
    from .data.store import load_echo_dataset
    from .errors import DatasetSchemaError, EchoTrlError, EpisodeError, TemplateError
    from .roles import Role, Trajectory
    from .tokens.tokenization import RoleTokens, tokenize_with_roles
    from .trainer import EchoGRPOTrainer


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'echo_trl' has no attribute {name!r}")
