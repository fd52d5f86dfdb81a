"""AWM-1K's breadth: batches that interleave more scenarios than the preamble cache holds.

A shuffled dataset of 1,000 scenarios puts up to 64 different tool preambles in one 64-row batch; the
cache keeps 64 preambles, and once evicted entries the same batch still needed (a ``KeyError`` before the
first step). Checked against the independent expectation: the tokenizer on the whole rendered text.
"""

from __future__ import annotations

import random

import pytest
from helpers.tiny import tiny_tokenizer
from helpers.trainer import make_trainer, trajectory

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.roles import Trajectory
from echo_trl.tokens.tokenization import tokenize_batch

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def scenario_trajectory(i: int, scenario: int) -> Trajectory:
    """Row ``i`` of ``scenario``: its own system prompt (AWM's names the scenario), so its own preamble."""
    t = trajectory(i, reward=float(i % 3) / 2, group=f"s{scenario}/t{i % 2}")
    prompt = [{"role": "system", "content": f"You operate scenario number {scenario}."}, t.prompt[1]]
    return Trajectory(
        prompt=prompt,
        completion=t.completion,
        warnings=t.warnings,
        reward=t.reward,
        group_id=t.group_id,
        scenario=f"scenario_{scenario}",
        task_idx=i % 2,
        tools=t.tools,
    )


def interleaved(n_scenarios: int, per_scenario: int, seed: int = 0) -> list[Trajectory]:
    rows = [scenario_trajectory(i, s) for s in range(n_scenarios) for i in range(per_scenario)]
    random.Random(seed).shuffle(rows)
    return rows


def test_a_batch_of_more_scenarios_than_the_cache_holds_tokenizes_exactly():
    tok = tiny_tokenizer("qwen3")
    rows = interleaved(200, 1)[:150]  # 150 preambles in one batch, more than twice the cache's 64
    assert len({r.prompt[0]["content"] for r in rows}) == 150
    tokenize_batch(tok, interleaved(70, 1, seed=1))  # the cache starts full of other scenarios' preambles
    for tokens in (tokenize_batch(tok, rows), tokenize_batch(tok, rows)):  # again: some now served from the cache
        for row, t in zip(rows, tokens, strict=True):
            assert t.input_ids == tok(t.text, add_special_tokens=False)["input_ids"]
            assert row.prompt[0]["content"] in t.text


def test_a_thousand_interleaved_scenarios_tokenize_and_train(tmp_path):
    rows = interleaved(1000, 1, seed=2)
    ds = trajectories_to_dataset(rows)
    trainer = make_trainer(tmp_path, ds, per_device_train_batch_size=8, behavior_policy="current")
    assert trainer.train_dataset.num_rows == 1000  # every row tokenized (64-row batches of 64 scenarios each)
    tok = tiny_tokenizer("qwen3")
    for k in (0, 499, 999):
        row = trainer.train_dataset[k]
        text = tokenize_batch(tok, [rows[k]])[0].text
        assert rows[k].prompt[0]["content"] in text
        assert row["echo_input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    out = trainer.train()
    assert out.global_step == 1
