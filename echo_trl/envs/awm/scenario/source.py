"""AWM scenarios as data: read them from an AgentWorldModel-1K-format directory or the Hub.

A scenario is spread over the dataset's ``gen_*.jsonl`` files, one record per scenario (tasks,
schema, sample rows, server code) or per task (verifiers)::

    gen_scenario.jsonl            {name, description}
    gen_tasks.jsonl               {scenario, tasks: [str x 10]}
    gen_db.jsonl                  {scenario, db_schema: {tables: [{name, ddl, indexes}]}}
    gen_sample.jsonl              {scenario, sample_data: {tables: [{table_name, insert_statements}]}}
    gen_envs.jsonl                {scenario, full_code}            (FastAPI app; tool = operation_id)
    gen_verifier.pure_code.jsonl  {scenario, task_idx, verification: {code}}   ("code" mode)
    gen_verifier.jsonl            {scenario, task_idx, verification: {code, raw_response}}  ("sql" mode)

Parts may be missing (the shared samples hold partial scenarios); a part is only required when
it is used, and then its absence is a :class:`ScenarioError` naming the scenario, the file and
the field. Hub access (``Snowflake/AgentWorldModel-1K``) goes through ``huggingface_hub``'s
cache, so a warm cache works offline (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....errors import EchoTrlError

HUB_REPO_ID = "Snowflake/AgentWorldModel-1K"

FILES = {
    "scenario": "gen_scenario.jsonl",
    "tasks": "gen_tasks.jsonl",
    "db": "gen_db.jsonl",
    "sample": "gen_sample.jsonl",
    "envs": "gen_envs.jsonl",
    "verifier_code": "gen_verifier.pure_code.jsonl",
    "verifier_sql": "gen_verifier.jsonl",
}
VERIFIER_MODES = ("code", "sql")


class ScenarioError(EchoTrlError):
    """Scenario data that cannot be used; names the scenario, file:line and field."""

    def __init__(
        self, message: str, *, scenario: str = "", source: str = "", line: int | None = None, field: str | None = None
    ):
        self.message, self.scenario, self.source, self.line, self.field = message, scenario, source, line, field
        where = [f"scenario {scenario!r}" if scenario else "", f"{source}:{line}" if line else source, field or ""]
        super().__init__(": ".join([w for w in where if w] + [message]))


@dataclass(frozen=True)
class VerifierSpec:
    """One task's verifier: Python source defining ``function`` (found by its ``def verify_`` line)."""

    scenario: str
    task_idx: int
    mode: str  # "code" | "sql"
    code: str
    function: str
    source: str  # file:line, for error messages
    raw_response: str = ""


@dataclass
class Scenario:
    """Everything one AWM scenario needs; absent parts are ``None`` until required."""

    name: str
    description: str = ""
    tasks: list[str] = field(default_factory=list)
    db_schema: dict[str, Any] | None = None
    sample_data: dict[str, Any] | None = None
    env_code: str | None = None
    verifiers: dict[tuple[int, str], VerifierSpec] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # part -> "file:line"

    def task(self, task_idx: int) -> str:
        if not self.tasks:
            raise ScenarioError("no tasks (missing from gen_tasks.jsonl)", scenario=self.name, field="tasks")
        if not 0 <= task_idx < len(self.tasks):
            raise ScenarioError(
                f"task_idx {task_idx} out of range 0..{len(self.tasks) - 1}",
                scenario=self.name,
                source=self.sources.get("tasks", ""),
                field="tasks",
            )
        return self.tasks[task_idx]

    def require(self, part: str) -> Any:
        """The value of ``part`` ("db_schema", "env_code", ...), or a clear error when it is missing."""
        value = getattr(self, part)
        if value is None:
            file = {"db_schema": FILES["db"], "sample_data": FILES["sample"], "env_code": FILES["envs"]}[part]
            raise ScenarioError(f"missing: no record for this scenario in {file}", scenario=self.name, field=part)
        return value

    def verifier(self, task_idx: int, mode: str = "code") -> VerifierSpec | None:
        return self.verifiers.get((task_idx, mode))


# --------------------------------------------------------------------------------------------
# Sources


class ScenarioSource:
    """Where ``gen_*.jsonl`` files come from: a local directory or the Hub (through its cache)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        hub_repo: str | None = None,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
    ):
        if (directory is None) == (hub_repo is None):
            raise ValueError("give exactly one of directory or hub_repo")
        self.directory = Path(directory) if directory is not None else None
        self.hub_repo, self.revision, self.cache_dir = hub_repo, revision, cache_dir
        self._cache: dict[str, Scenario] = {}

    @classmethod
    def from_dir(cls, directory: str | Path) -> ScenarioSource:
        directory = Path(directory)
        if not directory.is_dir():
            raise ScenarioError(f"not a directory: {directory}")
        if not any((directory / f).is_file() for f in FILES.values()):
            raise ScenarioError(f"no AWM gen_*.jsonl files in {directory} (expected e.g. {FILES['tasks']})")
        return cls(directory)

    @classmethod
    def from_hub(
        cls, repo_id: str = HUB_REPO_ID, *, revision: str | None = None, cache_dir: str | Path | None = None
    ) -> ScenarioSource:
        return cls(hub_repo=repo_id, revision=revision, cache_dir=cache_dir)

    def __repr__(self) -> str:
        return f"ScenarioSource({self.directory or 'hf://datasets/' + str(self.hub_repo)})"

    def path(self, filename: str) -> Path | None:
        """Local path of one dataset file, or ``None`` when the source does not have it."""
        if self.directory is not None:
            p = self.directory / filename
            return p if p.is_file() else None
        return self._hub_file(filename)

    def _hub_file(self, filename: str) -> Path | None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        try:
            return Path(
                hf_hub_download(
                    self.hub_repo, filename, repo_type="dataset", revision=self.revision, cache_dir=self.cache_dir
                )
            )
        except LocalEntryNotFoundError as exc:  # (a subclass of EntryNotFoundError: test it first)
            raise ScenarioError(
                f"{filename} is not in the Hugging Face cache and the Hub cannot be reached "
                f"(offline: HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}); download it once online "
                f"or pass --data DIR",
                source=f"hf://datasets/{self.hub_repo}/{filename}",
            ) from exc
        except EntryNotFoundError:
            return None

    # -- reading ------------------------------------------------------------------------------

    def _records(self, part: str, scenario: str | None) -> list[tuple[str, int, dict[str, Any]]]:
        """(source, line, record) of ``part``'s file whose scenario matches (all when ``None``)."""
        filename = FILES[part]
        path = self.path(filename)
        if path is None:
            return []
        key = "name" if part == "scenario" else "scenario"
        needle = json.dumps(scenario) if scenario is not None else None
        out = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip() or (needle is not None and needle not in line):
                    continue  # cheap pre-filter: the full dataset files are large
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    if scenario is None:
                        raise ScenarioError(f"invalid JSON: {exc}", source=filename, line=lineno) from None
                    raise ScenarioError(
                        f"invalid JSON: {exc}", scenario=scenario, source=filename, line=lineno
                    ) from None
                if not isinstance(record, dict):
                    raise ScenarioError(
                        "expected a JSON object", scenario=scenario or "", source=filename, line=lineno
                    )
                if scenario is None or record.get(key) == scenario:
                    out.append((filename, lineno, record))
        return out

    def list_scenarios(self) -> list[str]:
        """Names of the scenarios that have tasks, in file order."""
        names = []
        for src, line, rec in self._records("tasks", None):
            name = rec.get("scenario")
            if not isinstance(name, str) or not name:
                raise ScenarioError("expected a non-empty string", source=src, line=line, field="scenario")
            names.append(name)
        return names

    def load(self, name: str) -> Scenario:
        """Read and validate everything the dataset has for scenario ``name``."""
        if name in self._cache:
            return self._cache[name]
        sc = Scenario(name=name)
        found = False
        for part in ("scenario", "tasks", "db", "sample", "envs"):
            recs = self._records(part, name)
            if not recs:
                continue
            found = True
            src, line, rec = recs[0]
            where = dict(scenario=name, source=src, line=line)
            if part == "scenario":
                sc.description = _get(rec, "description", str, where, required=False) or ""
            elif part == "tasks":
                tasks = _get(rec, "tasks", list, where)
                for i, t in enumerate(tasks):
                    if not isinstance(t, str) or not t.strip():
                        raise ScenarioError("expected a non-empty string", field=f"tasks[{i}]", **where)
                sc.tasks, sc.sources["tasks"] = tasks, f"{src}:{line}"
            elif part == "db":
                sc.db_schema = _validate_schema(_get(rec, "db_schema", dict, where), where)
                sc.sources["db_schema"] = f"{src}:{line}"
            elif part == "sample":
                sc.sample_data = _validate_samples(_get(rec, "sample_data", dict, where), where)
                sc.sources["sample_data"] = f"{src}:{line}"
            elif part == "envs":
                code = _get(rec, "full_code", str, where)
                if not code.strip():
                    raise ScenarioError("empty server code", field="full_code", **where)
                sc.env_code, sc.sources["env_code"] = code, f"{src}:{line}"
        for mode in VERIFIER_MODES:
            for src, line, rec in self._records(f"verifier_{mode}", name):
                found = True
                where = dict(scenario=name, source=src, line=line)
                idx = _get(rec, "task_idx", int, where)
                ver = _get(rec, "verification", dict, where)
                code = _get(ver, "code", str, where, prefix="verification.")
                raw = ver.get("raw_response") if isinstance(ver.get("raw_response"), str) else ""
                sc.verifiers[(idx, mode)] = VerifierSpec(
                    name, idx, mode, code, verifier_function(code, mode), f"{src}:{line}", raw
                )
        if not found:
            where = self.directory or f"hf://datasets/{self.hub_repo}"
            raise ScenarioError(f"not found in {where}", scenario=name)
        self._cache[name] = sc
        return sc


def verifier_function(code: str, mode: str) -> str:
    """The verifier's entry point: the first top-level ``def verify_*`` (AWM's own rule)."""
    for line in code.splitlines():
        if line.startswith("def verify_") and "(" in line:
            return line[4 : line.index("(")].strip()
    return "verify_task_completion" if mode == "code" else "verify_task"


def _get(
    obj: dict[str, Any], key: str, kind: type, where: dict[str, Any], *, required: bool = True, prefix: str = ""
) -> Any:
    if key not in obj or obj[key] is None:
        if not required:
            return None
        raise ScenarioError("missing", field=prefix + key, **where)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ScenarioError(f"expected {kind.__name__}, got {type(value).__name__}", field=prefix + key, **where)
    return value


def _validate_schema(schema: dict[str, Any], where: dict[str, Any]) -> dict[str, Any]:
    tables = _get(schema, "tables", list, where, prefix="db_schema.")
    for i, t in enumerate(tables):
        here = f"db_schema.tables[{i}]"
        if not isinstance(t, dict):
            raise ScenarioError(f"expected an object, got {type(t).__name__}", field=here, **where)
        ddl = _get(t, "ddl", str, where, prefix=here + ".")
        if not ddl.strip():
            raise ScenarioError("empty DDL", field=here + ".ddl", **where)
        idx = t.get("indexes") or []
        if not isinstance(idx, list) or not all(isinstance(s, str) for s in idx):
            raise ScenarioError("expected a list of SQL strings", field=here + ".indexes", **where)
    return schema


def _validate_samples(samples: dict[str, Any], where: dict[str, Any]) -> dict[str, Any]:
    tables = _get(samples, "tables", list, where, prefix="sample_data.")
    for i, t in enumerate(tables):
        here = f"sample_data.tables[{i}]"
        if not isinstance(t, dict):
            raise ScenarioError(f"expected an object, got {type(t).__name__}", field=here, **where)
        stmts = _get(t, "insert_statements", list, where, prefix=here + ".")
        for j, s in enumerate(stmts):
            if not isinstance(s, str):
                raise ScenarioError(
                    f"expected a SQL string, got {type(s).__name__}", field=f"{here}.insert_statements[{j}]", **where
                )
    return samples
