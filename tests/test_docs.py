"""docs/api.md is what docs/make_api.py generates from the current docstrings; doc paths exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("make_api", REPO / "docs" / "make_api.py")
    make_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_api)
    assert (REPO / "docs" / "api.md").read_text(encoding="utf-8") == make_api.render(), \
        "docs/api.md is out of date: run python docs/make_api.py"


def test_training_doc_names_only_files_that_exist():
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    paths = set(re.findall(r"\b((?:examples|docs|data)/[\w./-]+\.(?:yaml|py|md|json))", text))
    assert paths
    missing = [p for p in sorted(paths) if not (REPO / p).exists()]
    assert not missing, missing
