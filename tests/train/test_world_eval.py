"""Held-out CE per role (the two-stage comparison's metric) against the world-model evaluation and a per-token loop."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import dataset

from echo_trl.roles import Role
from echo_trl.tokens.tokenization import tokenize_with_roles
from echo_trl.train.role_eval import evaluate_role_ce
from echo_trl.train.world_eval import evaluate_world_model


def test_role_ce_matches_the_world_eval_on_env_tokens_and_a_loop_on_action_tokens():
    model, tok = tiny_model(), tiny_tokenizer("qwen3")
    rows = list(dataset(3))
    got = evaluate_role_ce(model, tok, rows)
    world = evaluate_world_model(model, tok, rows)
    assert got["ce_env"] == pytest.approx(world["ce_env"], rel=1e-5) and got["tokens_env"] == world["tokens_env"]
    nll = n = 0.0
    with torch.no_grad():
        for row in rows:
            t = tokenize_with_roles(tok, row)
            logits = model(input_ids=torch.tensor([t.input_ids])).logits[0].double()
            for pos in range(1, len(t.input_ids)):
                if t.roles[pos] == Role.ACTION.code:
                    nll -= float(torch.log_softmax(logits[pos - 1], -1)[t.input_ids[pos]])
                    n += 1
    assert got["tokens_action"] == n > 0 and got["ce_action"] == pytest.approx(nll / n, rel=1e-5)
    assert got["trajectories"] == 3
