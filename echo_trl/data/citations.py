"""The papers echo_trl cites, once: ECHO and Agent World Model (AWM).

Every card cites them with these same entries: the dataset card (:mod:`echo_trl.data.card`), the model cards
(:mod:`echo_trl.train.model_card`) and, through TRL's ``_paper`` class attribute, the trainer's card template
(``EchoGRPOTrainer``); the README and docs carry the same text (``tests/data/test_card.py`` checks it).
"""

from __future__ import annotations

__all__ = ["ECHO_CITATION", "ECHO_PAPER", "AWM_CITATION"]

ECHO_CITATION = """@article{echo2026,
    title   = {{ECHO: Environment Cross-entropy Hybrid Objective}},
    journal = {arXiv preprint arXiv:2605.24517},
    year    = 2026,
}"""

#: ECHO's paper, in the shape of TRL's ``_paper`` (the template's "introduced in" line and citation).
ECHO_PAPER = {
    "title": "ECHO: Environment Cross-entropy Hybrid Objective",
    "id": "2605.24517",
    "citation": ECHO_CITATION,
}

AWM_CITATION = """@article{wang2026agentworldmodelinfinity,
    title   = {{Agent World Model: Infinity Synthetic Environments for Agentic Reinforcement Learning}},
    author  = {Zhaoyang Wang and Canwen Xu and Boyi Liu and Yite Wang and Siwei Han and Zhewei Yao and Huaxiu Yao
               and Yuxiong He},
    journal = {arXiv preprint arXiv:2602.10090},
    year    = 2026,
}"""
