"""``echo-trl capture --policy openai:`` against a hostile server (helpers/hostile_server.py), in-process (issue 32).

One capture plays one episode per case, one at a time (``a+b+c``: the n-th request gets the n-th mode): the run
ends with exit 0, every line it wrote is strict JSON, every episode is kept, and each case ends the way the
docs say: the well-formed control aligns; a body that is no strict JSON object or a malformed field ends its
episode (noted); an unusable log-prob, token id or text flags the turn (no ``behavior_logprobs``); an episode
over ``--max_rendered_chars`` is flagged, not a stopped run. A capture stopped (SIGTERM, Ctrl-C) while an
episode waits on a server that never answers ends at once and keeps what finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.awm_attacks import REPO, owned_runtime_dirs, running
from helpers.hostile_server import ANSWER, HostileServer
from helpers.processes import descendant_pids
from helpers.tiny import tiny_tokenizer

from echo_trl.commands.cli import main

LIBRARY = __import__("pathlib").Path(__file__).resolve().parents[3] / "data" / "awm_scenarios"
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

#: (mode, how its episode ends: "aligned" | "stopped: <note text>" | "flagged: <reason text>"), in play order.
CASES = [
    ("ok", "aligned"),
    ("nan_logprob", "stopped: NaN is not a JSON number"),
    ("inf_logprob", "stopped: Infinity is not a JSON number"),
    ("overflow_logprob", "stopped: 1e400 overflows a float"),
    ("tiny_logprob", "flagged: logprobs[0]: -1e+30 is below the floor -50"),
    ("positive_logprob", "flagged: logprobs[0]: 50 is above 0"),
    ("huge_digits_logprob", "flagged: logprobs[0]: a 401-digit number is no log-prob"),
    ("nan_argument", "stopped: NaN is not a JSON number"),
    ("negative_token_id", "flagged: token_ids[0]: -1 is no token id"),
    ("huge_token_id", "flagged: token_ids[0]: 9223372036854775808 is no token id"),
    ("outside_vocab_token_id", "flagged: token_ids[0]: 1000000000 is outside the tokenizer's vocabulary"),
    ("word_token_id", "flagged: logprobs[0].token: 'token_id:abc' is no token_id:N"),
    ("surrogate_content", "flagged: content: lone surrogate(s) replaced by U+FFFD"),
    ("tool_calls_int", "stopped: choices[0].message.tool_calls: expected a list, got int"),
    ("deep_json", "stopped: nested too deeply to read"),
    ("list_body", "stopped: a JSON list, not an object"),
    ("not_json", "stopped: not strict JSON"),
    ("big_arguments", "flagged: the episode could not be aligned"),  # last: its second request is "ok" again
]


def strict_lines(path) -> list[dict]:
    def refuse(name):
        raise AssertionError(f"{path}: {name} written")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text(encoding="utf-8").splitlines()]


def run_capture(argv: list[str], capsys) -> tuple[int, str]:
    sigterm = signal.getsignal(signal.SIGTERM)  # capture installs its own handler
    try:
        code = main(argv)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    tiny_tokenizer("qwen2_5").save_pretrained(path)
    return path


def capture_argv(url: str, tokenizer_dir, out, *extra: str) -> list[str]:
    return [
        *("capture", "--data", str(LIBRARY), "--scenario", "library_1", "--task_idx", "0"),
        *("--policy", f"openai:{url}", "--model", "hostile", "--tokenizer", str(tokenizer_dir)),
        *("--logprobs", "on", "--max_steps", "2", "--verify_turn", "omit", "--output", str(out)),
        *("--request_timeout", "20", "--max_retries", "0", *extra),
    ]


def test_every_hostile_response_ends_its_episode_or_flags_its_turn_and_the_run_goes_on(
    tokenizer_dir, tmp_path, capsys
):
    ids = tiny_tokenizer("qwen2_5").encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    modes = "+".join(mode for mode, _ in CASES)
    with HostileServer(ids) as server:
        argv = capture_argv(server.url(modes), tokenizer_dir, tmp_path / "out", "--episodes", str(len(CASES)))
        code, err = run_capture(argv, capsys)
    assert code == 0 and "Traceback" not in err, err
    (episodes,) = (tmp_path / "out").glob("*_task*.jsonl")
    records = sorted(strict_lines(episodes), key=lambda r: r["metadata"]["episode"]["index"])
    assert len(records) == len(CASES)
    for record, (mode, expected) in zip(records, CASES, strict=True):
        kind, _, text = expected.partition(": ")
        alignment = record.get("sampler", {}).get("alignment", {})
        notes = " | ".join(record["metadata"].get("notes", []))
        if kind == "aligned":
            assert alignment["status"] == "aligned" and record["behavior_logprobs"] == [-0.5] * len(ids), mode
        elif kind == "stopped":
            assert "policy stopped: " in notes and text in notes, (mode, notes)
            assert "behavior_logprobs" not in record, mode
        else:
            reasons = " | ".join(f["reason"] for f in alignment.get("flagged", []))
            assert alignment["status"] == "flagged" and text in reasons, (mode, alignment)
            assert "behavior_logprobs" not in record, mode
    big = records[-1]
    assert "--max_rendered_chars" in big["sampler"]["alignment"]["flagged"][0]["reason"]
    summary = json.loads((tmp_path / "out" / "capture_summary.json").read_text())
    assert summary["run"]["episodes"] == len(CASES) and summary["run"]["repaired"] == []


def test_a_key_with_a_stray_newline_is_refused_in_one_line_without_showing_it(
    tokenizer_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HOSTILE_KEY", "sk-do-not-print-me\r")
    with HostileServer([1]) as server:
        argv = capture_argv(server.url("ok"), tokenizer_dir, tmp_path / "out", "--api_key_env", "HOSTILE_KEY")
        code, err = run_capture(argv, capsys)
        assert server.requests == {}
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("echo-trl capture: error: "), err
    assert "$HOSTILE_KEY" in lines[0] and "do-not-print-me" not in err


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_capture_ends_without_waiting_for_its_server_and_keeps_the_finished_episodes(
    tokenizer_dir, tmp_path, sig, code
):
    """Two episodes finish; the third's request gets headers that never end, under a 600 s deadline. The
    signal ends the run long before that: the finished episodes stay, no server process or runtime dir."""
    ids = tiny_tokenizer("qwen2_5").encode(ANSWER + "<|im_end|>", add_special_tokens=False)
    out = tmp_path / "out"
    with HostileServer(ids) as server:
        argv = capture_argv(server.url("ok+ok+endless_headers"), tokenizer_dir, out, "--episodes", "3")
        argv += ["--request_timeout", "600"]  # the last value of a flag wins
        env = {**os.environ, "PYTHONPATH": str(REPO), "ECHO_TRL_PROGRESS": "0"}
        # Ctrl-C as in a terminal: a job a shell starts in the background ignores SIGINT, and so do its children
        cli = "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        cli += "from echo_trl.commands.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.Popen([sys.executable, "-c", cli, *argv], env=env, stderr=subprocess.PIPE, text=True)
        try:
            while sum(server.requests.values()) < 3 and proc.poll() is None:  # the third episode waits
                time.sleep(0.1)
            assert proc.poll() is None, proc.stderr.read()
            children = descendant_pids(proc.pid)  # the scenario server, contained
            assert children
            proc.send_signal(sig)
            err = proc.communicate(timeout=120)[1]  # a run that waits for the request is killed below
        finally:
            proc.kill()
    assert proc.returncode == code and "Traceback" not in err, (proc.returncode, err)
    records = strict_lines(next(out.glob("*_task*.jsonl")))
    assert sorted(r["metadata"]["episode"]["index"] for r in records) == [0, 1]
    assert not running(children) and not owned_runtime_dirs(proc.pid)
