"""``echo-trl capture``'s flags: one dataclass parsed by TRL's ``TrlParser`` (:mod:`echo_trl.command_line`).

Kept apart from :mod:`echo_trl.commands.capture.command` (the command) and
:mod:`echo_trl.commands.capture.run` (the local collection) because both read it: the command parses it, the
collection turns it into the library's typed ``CollectionSettings``. Every check of the flags alone is in
``__post_init__`` (a usage error, one line, exit 2), so a Python caller building :class:`CaptureArguments` meets
the same refusals as the command line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ...command_line import FlagValueError, Repeated, non_negative_number, positive_int, positive_number
from ...data.readers.formats import FORMATS, VERIFY_TURNS, default_verify_turn
from ...data.readers.prompt import DEFAULT_SYSTEM_PROMPT

#: The source flags: exactly one is given.
SOURCES = ("data", "hub", "openenv")
#: The kinds of ``--policy KIND:TARGET``.
POLICY_KINDS = ("replay", "model", "openai")


@dataclass(kw_only=True)
class CaptureArguments:
    """Flags of ``echo-trl capture``.

    Parameters:
        > Parameters that control where the scenarios come from (exactly one of `data`, `hub`, `openenv`)

        data (`str` or `None`, *optional*):
            AWM-1K-format directory with ``gen_*.jsonl`` files.
        hub (`bool`, *optional*, defaults to `False`):
            Read the Hub dataset (through the local HF cache).
        openenv (`str` or `None`, *optional*):
            URL of a running OpenEnv ``agent_world_model_env`` server to capture from instead of running here.
        hub_repo (`str` or `None`, *optional*):
            Hub dataset id (default ``Snowflake/AgentWorldModel-1K``).
        revision (`str` or `None`, *optional*):
            Hub revision.

        > Parameters that control what is captured

        scenario (`list[str]` or `None`, *optional*):
            Scenario names, one per ``--scenario`` (repeatable).
        scenario_file (`str` or `None`, *optional*):
            File of scenario names, one per line (``#`` starts a comment).
        all_scenarios (`bool`, *optional*, defaults to `False`):
            Every scenario of the source that has server code.
        task_idx (`list[int]` or `None`, *optional*):
            Task indices, one per ``--task-idx`` (repeatable); default every task the policy can play.
        policy (`str`):
            ``replay:FILE``, ``model:PATH`` or ``openai:URL``.
        episodes (`int` or `None`, *optional*):
            Episodes per task, a GRPO group (default 1; replaying recorded episodes: each recording once).
        output (`str`):
            Output directory (a rerun with the same one continues it).
        concurrency (`int`, *optional*, defaults to `1`):
            Episodes in flight at once.
        max_servers (`int` or `None`, *optional*):
            Scenario servers alive at once (default: ``concurrency``, at most 8).
        json (`bool`, *optional*, defaults to `False`):
            Print the summary as one JSON object on stdout.

        > Parameters that screen the scenarios (``echo-trl check-scenarios``)

        scenario_report (`str` or `None`, *optional*):
            A check's report (``scenario_report.json`` or its directory): its unusable scenarios and tasks are skipped.
        check (`bool`, *optional*, defaults to `False`):
            Check the scenarios first (into the output; a rerun reuses it) and skip what the check marks unusable.
        include_unusable (`bool`, *optional*, defaults to `False`):
            Play the scenarios and tasks the report marks unusable too (they are still listed in the log).

        > Parameters of the ``openai:URL`` policy (an OpenAI-compatible server)

        model (`str` or `None`, *optional*):
            The served model's name (required with ``openai:URL``).
        api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`):
            Environment variable holding the API key.
        request_timeout (`float`, *optional*, defaults to `300.0`):
            Seconds per request.
        max_retries (`int`, *optional*, defaults to `5`):
            Retries on 429 / 5xx / lost connections.
        retry_backoff (`float`, *optional*, defaults to `1.0`):
            First retry wait in seconds, doubling.
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus sampling.
        logprobs (`str`, *optional*, defaults to `"auto"`):
            Ask for the sampler's token ids and log-probs: ``auto`` (fall back when refused), ``on`` or ``off``.
        tokenizer (`str` or `None`, *optional*):
            The trainer's tokenizer, to align sampled log-probs with its tokenization (default: ``model``).
        tokenizer_from_hub (`bool`, *optional*, defaults to `False`):
            Without ``tokenizer``, fetch ``model``'s tokenizer from the Hub when it is not on this machine (by
            default only a local directory or the local Hugging Face cache is read: no network).

        > Parameters of the model policies (``model:PATH`` and ``openai:URL``)

        max_steps (`int`, *optional*, defaults to `8`):
            Turns per episode.
        max_new_tokens (`int`, *optional*, defaults to `256`):
            Tokens per turn.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature.
        seed (`int`, *optional*, defaults to `0`):
            Sampling seed.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Allow the model's own code to run.
        chat_template_path (`str` or `None`, *optional*):
            Render with this chat template instead of the tokenizer's (TRL's ``chat_template_path``: a ``.jinja``
            file or a tokenizer to take it from): the ``model:PATH`` policy's prompts and the tokenizer that
            sampled log-probs are aligned with.
        format (`str`, *optional*, defaults to `"chat-template"`):
            The conversation the policy speaks: ``chat-template`` or ``awm-agent`` (the official AWM agent's).
        system_prompt (`str`, *optional*, defaults to the chat-template prompt):
            System prompt (``{scenario}`` is filled in; ``""`` for none; ``awm-agent``: the official agent's).

        > Parameters of the environment

        verifier_mode (`str`, *optional*, defaults to `"code"`):
            Only code verifiers (SQL mode needs an LLM judge: the Python API with ``judge=...``).
        tool_timeout (`float`, *optional*, defaults to `30.0`):
            Seconds per tool call.
        verifier_timeout (`float`, *optional*, defaults to `30.0`):
            Seconds per verifier run.
        unsafe_no_sandbox (`bool`, *optional*, defaults to `False`):
            Run the generated server and verifier code without the bubblewrap sandbox.
        stop_on_format_error (`bool`, *optional*, defaults to `False`):
            End an episode at its first unknown tool / invalid arguments.
        continue_after_format_error (`bool`, *optional*, defaults to `False`):
            Hidden: the default behaviour, kept so that old command lines still run.
        verify_turn (`str` or `None`, *optional*):
            The verifier step as the last ``env_output`` turn or ``omit``-ted (default: by ``format``).
    """

    # --- the source: exactly one of data / hub / openenv (checked in __post_init__) ---
    data: str | None = field(
        default=None, metadata={"help": "AWM-1K-format directory with gen_*.jsonl files", "metavar": "DIR"}
    )
    hub: bool = field(default=False, metadata={"help": "read the Hub dataset (through the local HF cache)"})
    openenv: str | None = field(
        default=None,
        metadata={
            "help": "capture from a running OpenEnv agent_world_model_env server "
            "(e.g. http://localhost:8000) instead of running the scenario here",
            "metavar": "URL",
        },
    )
    hub_repo: str | None = field(
        default=None, metadata={"help": "Hub dataset id (default Snowflake/AgentWorldModel-1K)"}
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision"})

    # --- what is captured ---
    scenario: list[str] | None = field(
        default=None,
        metadata={"help": "scenario name (repeatable), e.g. content_platform_1", "action": Repeated},
    )
    scenario_file: str | None = field(
        default=None,
        metadata={"help": "scenario names, one per line ('#' starts a comment)", "metavar": "FILE"},
    )
    all_scenarios: bool = field(
        default=False,
        metadata={"help": "every scenario of --data / --hub that has server code (the others are listed in the log)"},
    )
    task_idx: list[int] | None = field(
        default=None,
        metadata={
            "help": "task index (repeatable, for every scenario); default: every task the policy can play",
            "action": Repeated,
        },
    )
    policy: str = field(metadata={"help": "replay:FILE, model:PATH or openai:URL"})
    episodes: int | None = field(
        default=None,
        metadata={
            "help": "episodes per task: a GRPO group (default 1; replaying recorded episodes: each recording once)"
        },
    )
    output: str = field(metadata={"help": "output directory (a rerun with the same one continues it)"})
    concurrency: int = field(default=1, metadata={"help": "episodes in flight at once (default 1)"})
    max_servers: int | None = field(
        default=None, metadata={"help": "scenario servers alive at once (default: --concurrency, <= 8)"}
    )
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object on stdout"})

    # --- screening with a scenario check ---
    scenario_report: str | None = field(
        default=None,
        metadata={
            "help": "report of `echo-trl check-scenarios` (its scenario_report.json or output directory): the "
            "scenarios and tasks it marks unusable are skipped",
            "metavar": "PATH",
        },
    )
    check: bool = field(
        default=False,
        metadata={
            "help": "run `check-scenarios` on the selected scenarios first (into --output, reused by a rerun) and "
            "skip what it marks unusable"
        },
    )
    include_unusable: bool = field(
        default=False,
        metadata={"help": "play the scenarios and tasks the report marks unusable too (still listed in the log)"},
    )

    # --- the openai:URL policy ---
    model: str | None = field(
        default=None, metadata={"help": "openai:URL policy: the served model's name (required with openai:URL)"}
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "openai:URL policy: environment variable holding the API key (default %(default)s)"},
    )
    request_timeout: float = field(
        default=300.0, metadata={"help": "openai:URL policy: seconds per request (default 300)"}
    )
    max_retries: int = field(
        default=5, metadata={"help": "openai:URL policy: retries on 429 / 5xx / lost connections (default 5)"}
    )
    max_response_bytes: int = field(
        default=16 << 20,
        metadata={
            "help": "openai:URL policy: the most bytes one response may hold, enforced while it streams in "
            "(default 16 MiB); a larger one ends its episode"
        },
    )
    max_rendered_chars: int = field(
        default=2_000_000,
        metadata={
            "help": "the longest rendered episode aligned with the tokenizer (default 2,000,000 characters, as "
            "build-dataset); a longer one is written without log-probs, flagged"
        },
    )
    retry_backoff: float = field(
        default=1.0, metadata={"help": "openai:URL policy: first retry wait in seconds, doubling"}
    )
    top_p: float = field(default=1.0, metadata={"help": "openai:URL policy: nucleus sampling (default 1.0)"})
    logprobs: str = field(
        default="auto",
        metadata={
            "help": "openai:URL policy: ask for the sampler's token ids and log-probs (vLLM): auto falls back when "
            "the server refuses",
            "choices": ["auto", "on", "off"],
        },
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "openai:URL policy: the trainer's tokenizer, to align sampled log-probs with its tokenization "
            "(default: --model)"
        },
    )
    tokenizer_from_hub: bool = field(
        default=False,
        metadata={
            "help": "openai:URL policy: without --tokenizer, fetch --model's tokenizer from the Hub when it is not on "
            "this machine (default: local files and the local HF cache only, no network)"
        },
    )

    # --- the model policies ---
    max_steps: int = field(default=8, metadata={"help": "model policy: turns per episode (default 8)"})
    max_new_tokens: int = field(default=256, metadata={"help": "model policy: tokens per turn (default 256)"})
    temperature: float = field(default=1.0, metadata={"help": "model policy: sampling temperature"})
    seed: int = field(default=0, metadata={"help": "model policy: sampling seed"})
    trust_remote_code: bool = field(default=False, metadata={"help": "model policy: allow the model's own code"})
    chat_template_path: str | None = field(
        default=None,
        metadata={
            "help": "model policy and log-prob alignment: render with this chat template (a .jinja file or a "
            "tokenizer to take it from, TRL's convention) instead of the tokenizer's"
        },
    )

    # --- the environment ---
    verifier_mode: str = field(
        default="code",
        metadata={
            "help": "only code verifiers (SQL mode needs an LLM judge; use the Python API with judge=...)",
            "choices": ["code"],
        },
    )
    tool_timeout: float = field(default=30.0, metadata={"help": "seconds per tool call (default 30)"})
    verifier_timeout: float = field(default=30.0, metadata={"help": "seconds per verifier run (default 30)"})
    unsafe_no_sandbox: bool = field(
        default=False,
        metadata={
            "help": "run the generated server and verifier code WITHOUT the bubblewrap sandbox (recorded in "
            "the capture log); by default capture refuses where the sandbox cannot be had"
        },
    )
    stop_on_format_error: bool = field(
        default=False,
        metadata={
            "help": "end an episode at its first unknown tool / invalid arguments (default: go on as AWM does; "
            "the episode reward stays -1.0 either way)"
        },
    )
    continue_after_format_error: bool = field(default=False, metadata={"help": argparse.SUPPRESS})  # the default
    format: str = field(
        default="chat-template",
        metadata={
            "help": "model policy: the conversation it speaks: chat-template (tool schemas in the chat template, "
            "its tool calls; default) or awm-agent (the official AWM agent's list_tools/call_tool)",
            "choices": list(FORMATS),
        },
    )
    verify_turn: str | None = field(
        default=None,
        metadata={
            "help": "the verifier step as the last env_output turn of the recorded conversation (default with "
            "chat-template), or out of it under 'verification' (default with awm-agent: the policy never "
            "sees it, as in the official AWM agent)",
            "choices": list(VERIFY_TURNS),
        },
    )
    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={
            "help": "model policy: system prompt ('{scenario}' is filled in, other braces are text; '' for none; "
            "awm-agent: the official agent's unless given)"
        },
    )

    def __post_init__(self):
        self.scenario = _as_list(self.scenario, str, "scenario")
        self.task_idx = _as_list(self.task_idx, int, "task_idx")
        self._check_source()
        for flag in ("max_servers", "max_steps", "max_new_tokens", "max_response_bytes", "max_rendered_chars"):
            if getattr(self, flag) is not None:
                positive_int(flag, getattr(self, flag))
        for flag in ("request_timeout", "tool_timeout", "verifier_timeout"):
            positive_number(flag, getattr(self, flag))
        non_negative_number("retry_backoff", self.retry_backoff)
        non_negative_number("temperature", self.temperature)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            shown = str(self.top_p).removesuffix(".0")  # as the user wrote it (argparse made 0 into 0.0)
            raise FlagValueError(f"argument --top_p: expected a number in (0, 1], got {shown!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise FlagValueError(f"argument --max_retries: expected an integer >= 0, got {str(self.max_retries)!r}")
        if self.episodes is not None and self.episodes < 1:
            raise FlagValueError("--episodes must be >= 1")
        if self.concurrency < 1:
            raise FlagValueError("--concurrency must be >= 1")
        self.verify_turn = self.verify_turn or default_verify_turn(self.format)
        if self.stop_on_format_error and self.continue_after_format_error:
            raise FlagValueError("--stop-on-format-error and --continue-after-format-error contradict each other")
        kind, target = self.policy_kind, self.policy_target
        if kind not in POLICY_KINDS or not target:
            raise FlagValueError(f"--policy must be replay:FILE, model:PATH or openai:URL, got {self.policy!r}")
        if kind == "model" and self.concurrency > 1:
            raise FlagValueError(
                "--policy model: generates in this process, one episode at a time: use --concurrency 1"
            )
        if self.scenario_report and self.check:
            raise FlagValueError("--scenario-report and --check contradict each other: give a report or check now")
        if self.include_unusable and not (self.scenario_report or self.check):
            raise FlagValueError("--include-unusable needs --scenario-report PATH or --check")
        if self.openenv:
            if len(self.scenario or []) != 1 or self.scenario_file or self.all_scenarios:
                raise FlagValueError("--openenv captures one scenario: give exactly one --scenario")
            if self.scenario_report or self.check:
                raise FlagValueError(
                    "--openenv: the scenario is checked where it runs (the OpenEnv server); "
                    "--scenario-report / --check screen local scenarios (--data / --hub)"
                )
        elif not (self.scenario or self.scenario_file or self.all_scenarios):
            raise FlagValueError("give --scenario NAME (repeatable), --scenario-file FILE or --all-scenarios")

    def _check_source(self) -> None:
        """Exactly one of ``--data``, ``--hub``, ``--openenv``, in argparse's words for a required exclusive group."""
        given = [name for name in SOURCES if getattr(self, name)]
        if not given:
            raise FlagValueError("one of the arguments --data --hub --openenv is required")
        if len(given) > 1:
            raise FlagValueError(f"argument --{given[1]}: not allowed with argument --{given[0]}")

    @property
    def policy_kind(self) -> str:
        """``replay``, ``model`` or ``openai``: the part of ``--policy`` before the colon."""
        return self.policy.partition(":")[0]

    @property
    def policy_target(self) -> str:
        """The file, model path or server URL after the colon of ``--policy``."""
        return self.policy.partition(":")[2]


def _as_list(value, kind: type, flag: str) -> list | None:
    """A repeatable flag's values as a list of ``kind``: ``--config`` may give one value, or values as strings."""
    if value is None:
        return None
    values = value if isinstance(value, list | tuple) else [value]
    try:
        if any(isinstance(v, bool) or (kind is int and isinstance(v, float)) for v in values):
            raise ValueError
        return [kind(v) for v in values]
    except (TypeError, ValueError):
        raise FlagValueError(f"argument --{flag}: invalid {kind.__name__} value in {value!r}") from None
