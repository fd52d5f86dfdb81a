"""The typed trajectory dataset: schema, round trips, determinism, loading paths and the card."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import datasets
import pytest
from helpers.episodes import openenv_episode, session_episode
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from echo_trl.data.build import build_awm_dataset, trajectories_to_dataset
from echo_trl.data.readers.records import awm_episode_to_trajectory
from echo_trl.data.schema import FEATURES, row_to_trajectory
from echo_trl.data.store import load_echo_dataset, save_dataset, validate_dataset
from echo_trl.errors import DatasetSchemaError, EpisodeError


@pytest.fixture
def episode_dir(tmp_path):
    d = tmp_path / "episodes"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(openenv_episode()))
    (d / "b.json").write_text(json.dumps(session_episode()))
    (d / "c.jsonl").write_text(
        "\n".join(json.dumps(openenv_episode(task_idx=i, reward=r)) for i, r in [(5, 1.0), (5, 0.1)]) + "\n"
    )
    return d


def test_rows_have_the_explicit_schema_and_round_trip(episode_dir):
    ds = build_awm_dataset([episode_dir])
    assert ds.features == FEATURES and len(ds) == 4
    originals = [awm_episode_to_trajectory(openenv_episode()), awm_episode_to_trajectory(session_episode())]
    for row, original in zip(ds, originals, strict=False):
        back = row_to_trajectory(row)
        assert back.messages == original.messages  # tool-call arguments come back as objects
        assert back.tools == original.tools and back.warnings == original.warnings
        assert (back.reward, back.group_id) == (original.reward, original.group_id)
    assert ds[2]["group_id"] == ds[3]["group_id"] == "shop_1/5"


def test_build_is_deterministic(episode_dir):
    a, b = build_awm_dataset([episode_dir]), build_awm_dataset([episode_dir])
    assert a.to_list() == b.to_list()
    assert a["task_idx"] == [2, 0, 5, 5]  # sorted files, file order within


def test_rows_are_trl_conversational(episode_dir):
    from trl.data_utils import is_conversational

    from echo_trl.demo.tiny import build_tiny_tokenizer

    row = build_awm_dataset([episode_dir])[0]
    assert is_conversational(row)
    tok = build_tiny_tokenizer("qwen2_5")
    back = row_to_trajectory(row)
    text = tok.apply_chat_template(back.messages, tools=back.tools, tokenize=False)
    assert '"arguments": {"q": "notebook"}' in text


def test_lenient_build_keeps_valid_rows(episode_dir):
    (episode_dir / "d.jsonl").write_text('{"broken": \n' + json.dumps(openenv_episode(task_idx=9)) + "\n")
    with pytest.raises(EpisodeError, match=r"d.jsonl:1: invalid JSON"):
        build_awm_dataset([episode_dir])
    skipped = []
    ds = build_awm_dataset([episode_dir], strict=False, skipped=skipped)
    assert len(ds) == 5 and ds["task_idx"][-1] == 9
    assert [(s.record, s.raw) for s in skipped] == [("1", '{"broken": ')]


def test_save_load_and_parquet_paths(episode_dir, tmp_path):
    ds = build_awm_dataset([episode_dir])
    out = save_dataset(ds, tmp_path / "ds")
    assert load_echo_dataset(out).to_list() == ds.to_list()
    # The Hub path: load_dataset on data files (what a pushed repo holds), cast back to our schema.
    pq = tmp_path / "hub_like" / "data"
    pq.mkdir(parents=True)
    ds.to_parquet(str(pq / "train-00000-of-00001.parquet"))
    loaded = load_echo_dataset(tmp_path / "hub_like")
    assert loaded.features == FEATURES and loaded.to_list() == ds.to_list()


def test_dataset_card_counts_roles_and_attributes_awm(episode_dir, tmp_path):
    ds = build_awm_dataset([episode_dir])
    card = (save_dataset(ds, tmp_path / "ds") / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "arXiv 2602.10090" in card and "2605.24517" in card
    n_tool_msgs = sum(m["role"] == "tool" for row in ds for m in row["completion"])
    assert f"| `env_output` | {n_tool_msgs} |" in card
    assert "| shop_1 | 4 | 3 |" in card  # 4 episodes, 3 distinct tasks


def test_schema_validation_names_columns():
    ds = trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode())])
    with pytest.raises(DatasetSchemaError, match="missing column.*completion"):
        validate_dataset(ds.remove_columns(["completion"]), "my_ds")
    bad = datasets.Dataset.from_dict({**ds.remove_columns(["reward"]).to_dict(), "reward": [["x"]]})
    with pytest.raises(DatasetSchemaError, match="reward"):
        validate_dataset(bad)
    no_logprobs = ds.remove_columns(["behavior_logprobs"])
    assert validate_dataset(no_logprobs).features == FEATURES


def test_a_plain_trl_conversational_dataset_is_told_the_way_in_and_the_way_works(tmp_path):
    messages = [
        {"role": "user", "content": "Find the order."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "find", "arguments": "{}"}}],
        },
        {"role": "tool", "name": "find", "content": "order 7"},
        {"role": "assistant", "content": "It is order 7."},
    ]
    trl_ds = datasets.Dataset.from_list([{"messages": messages, "reward": 1.0}, {"messages": messages, "reward": 0.0}])
    with pytest.raises(DatasetSchemaError) as exc:
        validate_dataset(trl_ds, "my_ds")
    message = str(exc.value)
    assert message.startswith("my_ds: missing column(s) prompt, completion") and "conversational" in message
    assert "ds.to_json('conversations.jsonl')" in message and "echo-trl build-dataset conversations.jsonl" in message
    trl_ds.to_json(tmp_path / "conversations.jsonl")  # what the message says, then build-dataset's reader
    built = validate_dataset(build_awm_dataset([tmp_path / "conversations.jsonl"]), "built")
    assert built["reward"] == [1.0, 0.0] and [m["role"] for m in built[0]["completion"]] == [
        "assistant",
        "tool",
        "assistant",
    ]
    other = datasets.Dataset.from_dict({"text": ["hello"]})
    with pytest.raises(DatasetSchemaError, match=r"`echo-trl build-dataset FILES --output DIR`$"):
        validate_dataset(other, "text_ds")


# --------------------------------------------------------------------------------------------
# Poison records (issue 13): each between two valid ones, through the Arrow encoding and the save


def _dumped(mutate=None, text=None):
    """A JSONL line: ``openenv_episode`` changed by ``mutate``, then ``text`` (old, new) replaced."""
    ep = openenv_episode(task_idx=2)
    if mutate:
        mutate(ep)
    line = json.dumps(ep)  # ensure_ascii: a lone surrogate is written as the escape \ud800
    return line.replace(*text) if text else line


def _set_args(ep, value):
    ep["steps"][0]["action"]["arguments"] = value


POISON = {
    "lone surrogate in the task": (_dumped(lambda e: e.update(task="\ud800")), "task: lone surrogate '\\ud800'"),
    "lone surrogate in the scenario": (_dumped(lambda e: e.update(scenario="s\udbff")), "scenario: lone surrogate"),
    "lone surrogate in a tool name": (
        _dumped(lambda e: e["steps"][0]["action"].update(tool_name="\udc00")),
        "steps[0].action.tool_name: lone surrogate",
    ),
    "lone surrogate in an argument key": (
        _dumped(lambda e: _set_args(e, {"\ud800": 1})),
        "steps[0].action.arguments (a key): lone surrogate",
    ),
    "lone surrogate in a JSON-string argument": (
        _dumped(lambda e: _set_args(e, '{"q": ["\\ud800"]}')),
        "steps[0].action.arguments.q[0]: lone surrogate",
    ),
    "lone surrogate in a tool output": (
        _dumped(lambda e: e["steps"][1]["observation"].update(error="\udfff")),
        "steps[1].observation.error: lone surrogate",
    ),
    "lone surrogate in a tool schema": (
        _dumped(lambda e: e.update(tools=[{"name": "f", "description": "\ud800"}])),
        "tools[0].description: lone surrogate",
    ),
    "lone surrogate in a warning": (
        _dumped(lambda e: e["steps"][0]["observation"].update(warning="\ud800")),
        "steps[0].observation.warning: lone surrogate",
    ),
    "JSON-string argument nested 5,000 deep": (
        _dumped(lambda e: _set_args(e, '{"a": ' + "[" * 5000 + "]" * 5000 + "}")),
        "steps[0].action.arguments: arguments string is not valid JSON (nested too deeply)",
    ),
    "tool output nested 5,000 deep": (
        _dumped(text=('"422: id must be an integer"', "[" * 5000 + "]" * 5000)),
        "invalid JSON",
    ),
    "reward 1 followed by 400 zeros": (
        _dumped(text=('"reward": 0.0', '"reward": 1' + "0" * 400)),
        "reward: number out of range",
    ),
    "reward 1e400": (_dumped(text=('"reward": 0.0', '"reward": 1e400')), "invalid JSON: number 1e400 is out of range"),
    "task_idx 1e23": (
        _dumped(text=('"task_idx": 2', '"task_idx": 1e23')),
        "task_idx: expected an integer, got a number",
    ),
    "task_idx 10**23": (_dumped(lambda e: e.update(task_idx=10**23)), "task_idx: integer out of range"),
    "task_idx of 5,000 digits": (_dumped(text=('"task_idx": 2', '"task_idx": ' + "7" * 5000)), "invalid JSON"),
    "behavior_logprobs with a huge integer": (
        _dumped(lambda e: e.update(behavior_logprobs=[10**400])),
        "behavior_logprobs[0]: number out of range",
    ),
}


@pytest.mark.parametrize("name", sorted(POISON))
def test_poison_record_between_two_valid_ones(name, tmp_path):
    line, message = POISON[name]
    path = tmp_path / "eps.jsonl"
    path.write_text(
        "\n".join([json.dumps(openenv_episode(task_idx=1)), line, json.dumps(openenv_episode(task_idx=3))]) + "\n"
    )
    with pytest.raises(EpisodeError) as err:
        build_awm_dataset([path])
    assert str(err.value).startswith(f"{path}:2: {message}") and "\n" not in str(err.value), str(err.value)[:300]
    skipped = []
    ds = build_awm_dataset([path], strict=False, skipped=skipped)
    assert ds["task_idx"] == [1, 3] and [s.record for s in skipped] == ["2"]
    out = save_dataset(ds, tmp_path / "ds", skipped=skipped)
    (report,) = [json.loads(x) for x in (out / "skipped.jsonl").read_text(encoding="utf-8").splitlines()]
    assert report["record"] == "2" and report["reason"] == str(err.value)
    assert load_echo_dataset(out)["task_idx"] == [1, 3]


def test_a_value_arrow_cannot_store_is_named_by_row_and_column():
    from dataclasses import replace

    good = awm_episode_to_trajectory(openenv_episode())
    with pytest.raises(
        EpisodeError,
        match=r"^trajectories:row 1: scenario: cannot be stored in the dataset "
        r"\(UnicodeEncodeError",
    ):
        trajectories_to_dataset([good, replace(good, scenario="\ud800")])
    with pytest.raises(EpisodeError, match=r"^trajectories:row 0: task_idx: cannot be stored"):
        trajectories_to_dataset([replace(good, task_idx=2**63)])
    nan_args = awm_episode_to_trajectory(openenv_episode())
    nan_args.completion[0]["tool_calls"][0]["function"]["arguments"] = {"x": float("nan")}
    with pytest.raises(
        EpisodeError,
        match=r"row 0: completion\[0\]\.tool_calls\[0\]\.function\.arguments: "
        r"cannot store as JSON text",
    ):
        trajectories_to_dataset([nan_args])  # stored argument text is standard JSON, never NaN
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    good.completion[0]["tool_calls"][0]["function"]["arguments"] = {"a": deep}
    with pytest.raises(
        EpisodeError,
        match=r"row 0: completion\[0\]\.tool_calls\[0\]\.function\.arguments: "
        r"nested too deeply",
    ):
        trajectories_to_dataset([good])


def test_argument_text_that_is_not_json_is_a_schema_error():
    row = trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode())])[0]
    row["completion"][0]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(
        DatasetSchemaError,
        match=r"completion\[0\]\.tool_calls\[0\]\.function\.arguments: "
        r"expected JSON text",
    ):
        row_to_trajectory(row)
    row["completion"][0]["tool_calls"][0]["function"]["arguments"] = "[" * 100_000
    with pytest.raises(DatasetSchemaError, match="nested too deeply"):
        row_to_trajectory(row)


POISON_PATHS = [
    ("task",),
    ("scenario",),
    ("task_idx",),
    ("reward",),
    ("tools",),
    ("tools", 0),
    ("steps", 0, "action", "tool_name"),
    ("steps", 0, "action", "arguments"),
    ("steps", 0, "action", "arguments", "q"),
    ("steps", 1, "observation", "error"),
    ("steps", 0, "observation", "warning"),
    ("behavior_logprobs",),
    ("steps", 2),
]
_TEXT = st.text(st.sampled_from(["a", "é", "\x00", "\ud800", "\udfff", "\U0001f642", '"', "\\", "{"]), max_size=8)
_FRAGMENT = st.one_of(  # JSON text of the poison value
    st.builds(
        json.dumps,
        st.one_of(
            st.none(),
            st.booleans(),
            _TEXT,
            st.floats(allow_nan=False),
            st.integers(),
            st.sampled_from([2**63, -(2**63) - 1, 10**23, 10**400]),
            st.lists(_TEXT, max_size=3),
            st.dictionaries(_TEXT, _TEXT, max_size=3),
        ),
    ),
    st.sampled_from(["1e400", "-1e400", "1e23", "9" * 5000, "NaN", "Infinity"]),
    st.integers(1, 6000).map(lambda d: "[" * d + "]" * d),
)
_POISON = st.one_of(_FRAGMENT, _FRAGMENT.map(lambda f: json.dumps('{"q": ' + f + "}")))  # also as a JSON string


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(POISON_PATHS), fragment=_POISON)
@example(path=("task_idx",), fragment="0")  # a valid task_idx: kept as the record's own
@example(path=("task_idx",), fragment="true")  # a bool is no task_idx
def test_any_value_anywhere_is_kept_or_skipped_never_fatal(path, fragment):
    ep = openenv_episode(task_idx=2, behavior_logprobs=[-0.5], tools=["search", "add_to_cart"])
    target = ep
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@@POISON@@"
    poisoned = json.dumps(ep).replace('"@@POISON@@"', fragment)
    with tempfile.TemporaryDirectory() as tmp:
        eps = Path(tmp) / "eps.jsonl"
        eps.write_text(
            "\n".join([json.dumps(openenv_episode(task_idx=1)), poisoned, json.dumps(openenv_episode(task_idx=3))])
            + "\n"
        )
        skipped = []
        ds = build_awm_dataset([eps], strict=False, skipped=skipped)  # never raises
        kept = 2
        if path == ("task_idx",) and not skipped:  # the poison replaced task_idx itself with a valid value
            kept = json.loads(fragment)
            assert type(kept) is int, fragment  # kept only as an integer (not a bool, not a float)
        assert list(ds["task_idx"]) == ([1, 3] if skipped else [1, kept, 3])
        assert len(ds) + len(skipped) == 3
        event("poison skipped" if skipped else "poison kept (a valid value there)")
        assert all(s.record == "2" and s.reason.startswith(f"{eps}:2: ") and "\n" not in s.reason for s in skipped)
        try:
            strict = build_awm_dataset([eps])
            assert strict.to_list() == ds.to_list()
        except EpisodeError as exc:
            assert skipped and str(exc) == skipped[0].reason
        out = save_dataset(ds, Path(tmp) / "ds", skipped=skipped)
        lines = (out / "skipped.jsonl").read_text(encoding="utf-8").splitlines() if skipped else []
        assert [json.loads(x)["record"] for x in lines] == ["2"] * len(skipped)
        assert load_echo_dataset(out).to_list() == ds.to_list()


def test_format_is_recorded_and_chosen_per_build(episode_dir, tmp_path):
    from echo_trl.data.readers.awm_agent import SYSTEM_PROMPT

    (episode_dir / "a.json").write_text(
        json.dumps(
            openenv_episode(
                tools=[
                    {"name": "search", "description": "Search.", "inputSchema": {}},
                    {"name": "add_to_cart", "description": "Add.", "inputSchema": {}},
                ]
            )
        )
    )
    (episode_dir / "c.jsonl").unlink()
    plain = build_awm_dataset([episode_dir])
    agent = build_awm_dataset([episode_dir], format="awm-agent")
    assert plain["format"] == ["chat-template"] * 2 and agent["format"] == ["awm-agent"] * 2
    assert agent.features == FEATURES
    assert [r["prompt"][0]["content"] for r in agent] == [SYSTEM_PROMPT] * 2
    names = [[c["function"]["name"] for m in r["completion"] for c in m["tool_calls"] or []] for r in agent]
    assert names == [["list_tools", "call_tool", "call_tool"], ["list_tools", "call_tool", "call_tool"]]
    with_verifier = build_awm_dataset([episode_dir], format="awm-agent", verify_turn="env_output")
    assert [len(r["completion"]) for r in with_verifier] == [len(r["completion"]) + 1 for r in agent]
    save_dataset(agent, tmp_path / "ds")
    assert load_echo_dataset(tmp_path / "ds")["format"] == ["awm-agent"] * 2
    assert "Conversation format: `awm-agent`" in (tmp_path / "ds" / "README.md").read_text()
    with pytest.raises(ValueError, match="unknown format 'chat'"):
        build_awm_dataset([episode_dir], format="chat")


def test_each_episode_is_built_in_the_format_it_was_captured_in(tmp_path):
    """capture records metadata.format; a build without --format keeps it, episode by episode. The sampler's
    log-probs belong to the captured conversation: another format is refused for that record, in one line."""
    tools = [{"name": "search", "description": "Search.", "inputSchema": {}}]

    def write(name, format=None, logprobs=None):
        ep = openenv_episode(tools=tools)
        if format is not None:
            ep["metadata"] = {"format": format}
        if logprobs is not None:
            ep["behavior_logprobs"] = logprobs
        (tmp_path / name).write_text(json.dumps(ep))
        return tmp_path / name

    agent, plain, none = write("a.json", "awm-agent"), write("b.json", "chat-template"), write("c.json")
    built = build_awm_dataset([agent, plain, none])
    assert built["format"] == ["awm-agent", "chat-template", "chat-template"]
    assert built[0]["completion"][0]["tool_calls"][0]["function"]["name"] == "list_tools"  # the official agent's
    assert build_awm_dataset([agent], format="chat-template")["format"] == ["chat-template"]  # asked for: as asked

    sampled = write("s.json", "awm-agent", logprobs=[-0.5] * 3)
    with pytest.raises(EpisodeError, match=r"s\.json: behavior_logprobs: .*awm-agent conversation.*format awm-agent"):
        build_awm_dataset([sampled], format="chat-template")
    assert build_awm_dataset([sampled])["format"] == ["awm-agent"]  # its own format: kept with its log-probs
    kept: list = []
    assert build_awm_dataset([sampled, plain], format="chat-template", strict=False, skipped=kept).num_rows == 1
    assert [k.source for k in kept] == [str(sampled)]

    (tmp_path / "bad.json").write_text(json.dumps({**openenv_episode(tools=tools), "metadata": {"format": "chat"}}))
    with pytest.raises(EpisodeError, match=r"bad\.json: metadata\.format: 'chat' is not a format"):
        build_awm_dataset([tmp_path / "bad.json"])
    with pytest.raises(EpisodeError, match=r"a\.json: metadata\.format: captured as awm-agent"):
        build_awm_dataset([agent], compact_tools=True)


def test_datasets_built_before_formats_load_as_chat_template(episode_dir):
    old = build_awm_dataset([episode_dir]).remove_columns("format")
    assert validate_dataset(old)["format"] == ["chat-template"] * 4


def test_verify_turn_omit_in_chat_template_keeps_the_final_answer():
    ep = openenv_episode()
    ep["steps"][-1]["action"]["arguments"]["final_answer"] = "Added."
    kept = awm_episode_to_trajectory(ep)
    omitted = awm_episode_to_trajectory(ep, verify_turn="omit")
    assert kept.completion[-2]["tool_calls"][0]["function"]["name"] == "verify"
    assert omitted.completion[:-1] == kept.completion[:-2]
    assert omitted.completion[-1] == {"role": "assistant", "content": "Added."}
    with pytest.raises(ValueError, match="unknown verify_turn"):
        awm_episode_to_trajectory(ep, verify_turn="hide")
