"""``--config PATH``: checked before TRL's parser reads it, so a bad file is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

from ..errors import EchoTrlError


def check_config_file(argv: list[str]) -> None:
    """``--config PATH`` names a readable YAML mapping (TRL would raise a traceback)."""
    if "--config" not in argv:
        return
    i = argv.index("--config")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise EchoTrlError("--config: expected a YAML file path after it")
    path = Path(argv[i + 1])
    if not path.is_file():
        raise EchoTrlError(f"--config {path}: no such file")
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EchoTrlError(f"--config {path}: not readable YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict):
        raise EchoTrlError(f"--config {path}: expected a mapping of flag names to values, got {type(config).__name__}")
