"""The held-out evaluator's CE per role (env output, warnings, actions) against a per-token loop over full logits."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import dataset

from echo_trl.roles import Role
from echo_trl.tokens.tokenization import tokenize_with_roles
from echo_trl.train.world_eval import evaluate_world_model


def test_every_roles_ce_is_the_full_logits_loop():
    model, tok = tiny_model(), tiny_tokenizer("qwen3")
    rows = list(dataset(3))  # row 1 carries a harness warning
    got = evaluate_world_model(model, tok, rows, show_progress=False)
    codes = {"env": Role.ENV_OUTPUT.code, "warning": Role.WARNING.code, "action": Role.ACTION.code}
    nll, n = dict.fromkeys(codes, 0.0), dict.fromkeys(codes, 0)
    with torch.no_grad():
        for row in rows:
            t = tokenize_with_roles(tok, row)
            logits = model(input_ids=torch.tensor([t.input_ids])).logits[0].double()
            for pos in range(1, len(t.input_ids)):
                for name, code in codes.items():
                    if t.roles[pos] == code:
                        nll[name] -= float(torch.log_softmax(logits[pos - 1], -1)[t.input_ids[pos]])
                        n[name] += 1
    for name in codes:
        assert got[f"tokens_{name}"] == n[name] > 0, name
        assert got[f"ce_{name}"] == pytest.approx(nll[name] / n[name], rel=1e-5), name
    assert got["trajectories"] == 3 and sum(s["tokens_env"] for s in got["by_scenario"].values()) == n["env"]
