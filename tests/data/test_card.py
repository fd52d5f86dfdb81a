"""The dataset card: counts in words, no placeholder link, and the one ECHO citation every card and doc uses."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.episodes import openenv_episode

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.data.card import dataset_card, plural
from echo_trl.data.citations import ECHO_CITATION
from echo_trl.data.readers.records import awm_episode_to_trajectory

REPO = Path(__file__).resolve().parents[2]


def test_dataset_card_plurals_no_placeholder_link_and_the_one_echo_citation():
    one = trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode())])
    card = dataset_card(one, skipped=1)
    assert "1 episode,\n1 scenario, 1 invalid record skipped" in card
    assert "https://github.com/)" not in card and ECHO_CITATION in card
    two = trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode(scenario=s)) for s in ("a_1", "b_2")])
    assert "2 episodes,\n2 scenarios." in dataset_card(two)
    assert [plural(n, "scenario") for n in (0, 1, 2)] == ["0 scenarios", "1 scenario", "2 scenarios"]


def test_one_echo_citation_everywhere():
    """Every ECHO bibtex entry in the README and docs is the one the cards write."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for start in (m.start() for m in re.finditer(r"@article\{echo2026", text)):
            assert text[start : start + len(ECHO_CITATION)] == ECHO_CITATION, doc
    assert ECHO_CITATION in (REPO / "README.md").read_text(encoding="utf-8")
