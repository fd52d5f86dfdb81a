"""Many AWM scenarios in one run: scenario servers started lazily and pooled under a bound.

AWM-1K has 1,000 scenarios; an online batch can touch dozens. A server process per rollout
(what one :class:`~echo_trl.envs.awm.runtime.episode.AWMRuntime` per environment instance gives)
costs a start (~1 s) and tens of MB each, so the pool separates *state* from *compute*:

* every session (episode) owns its database: a copy of the scenario's initial snapshot, made
  at the session's start, a file in the pool's private temp dir that only the host writes;
* servers are compute, pooled per scenario: a tool call leases a server of the session's
  scenario, has it load the session's database into its live database when another session
  used it last (the image crosses the sandbox boundary over the server's database channel,
  bounded; SQLite backup API inside, milliseconds), calls the tool, and saves the live database
  back to the session's copy the same way. The verifier reads the session's copy; it needs no
  server;
* at most ``max_servers`` servers live at once. A server starts when a call needs one and none
  of its scenario is idle; at the bound, the least recently used idle server is closed first,
  never one in use. When every server is busy, the call waits for one to come free.

The policy is the pure function :func:`choose_slot` (tested without servers); :class:`ServerPool`
wires it to real runtimes. Leases last one tool call, so the bound holds however many sessions
are open (a batch's rollouts call concurrently); :meth:`ServerPool.warm` starts servers ahead of them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....clients.mcp import CallTimedOut, MCPError, MCPSession, ToolOutcome
from ....errors import EchoTrlError
from ....io.atomic import write_file
from ....sandbox import bwrap, hostio
from ..scenario.database import MAX_IMAGE_BYTES
from ..scenario.source import Scenario, ScenarioError
from .episode import AWMRuntime, Episode
from .server import DatabaseUnavailable
from .settings import AWMSettings
from .verifier import VerifyOutcome, verify_databases


class PoolError(EchoTrlError):
    """The pool cannot serve a call (closed, unknown scenario, no server free in time)."""


# The policy (pure)


@dataclass
class SlotState:
    """What the policy knows of one live server: its scenario, whether a call holds it, when it
    was last released (a logical clock) and whose database is in it."""

    id: int
    scenario: str
    in_use: bool = False
    last_used: int = 0
    occupant: str | None = None


@dataclass(frozen=True)
class Decision:
    """``reuse`` slot ``slot``; ``start`` a server (closing idle slot ``evict`` first); or ``wait``."""

    action: str
    slot: int | None = None
    evict: int | None = None


def choose_slot(slots: Sequence[SlotState], scenario: str, occupant: str | None, bound: int) -> Decision:
    """Which server a call of ``occupant`` (a session) on ``scenario`` gets.

    An idle server of the scenario is reused, preferably the one already holding the session's
    database (no restore needed), else the most recently used. Otherwise a server starts: under
    the bound directly, at the bound after closing the least recently used idle server. If a
    server of the scenario exists but is busy at the bound, or every server is busy, wait: its
    call ends soon, which is cheaper than a start.
    """
    if bound < 1:
        raise ValueError(f"max_servers must be >= 1, got {bound}")
    idle_mine = [s for s in slots if s.scenario == scenario and not s.in_use]
    if idle_mine:
        best = max(idle_mine, key=lambda s: (occupant is not None and s.occupant == occupant, s.last_used))
        return Decision("reuse", slot=best.id)
    if len(slots) < bound:
        return Decision("start")
    if any(s.scenario == scenario for s in slots):
        return Decision("wait")
    idle = [s for s in slots if not s.in_use]
    if idle:
        return Decision("start", evict=min(idle, key=lambda s: s.last_used).id)
    return Decision("wait")


# Runtime wiring


@dataclass
class _Slot:
    state: SlotState
    runtime: AWMRuntime | None = None
    mcp: MCPSession | None = None


@dataclass
class _Prepared:
    snapshot: bytes
    tools: list[dict[str, Any]]


@dataclass
class PoolStats:
    """Counters a benchmark reads (starts and their seconds, evictions, restores); each scenario's build report."""

    starts: int = 0
    start_seconds: list[float] = field(default_factory=list)
    evictions: int = 0
    restores: int = 0
    waits: int = 0
    databases: dict[str, str] = field(default_factory=dict)


def _shutdown(slots: dict[int, _Slot], root: Path) -> None:
    """Stop every server of a pool and remove its dir (a finalizer: also at exit, also if never closed)."""
    items = list(slots.values())
    slots.clear()
    for slot in items:
        _close_slot(slot)
    with contextlib.suppress(OSError):
        hostio.remove_tree(root)


class ServerPool:
    """Scenario servers under a bound, shared by sessions that each own a database copy.

    ``settings`` (:class:`~echo_trl.envs.awm.runtime.settings.AWMSettings`) go to every runtime the pool
    starts; ``options`` change single fields of it (``ServerPool(2, wait_timeout=5)``; ``max_servers`` may
    come first). ``wait_timeout`` bounds how long a call waits for a busy server before :class:`PoolError`.
    """

    def __init__(
        self,
        max_servers: int | None = None,
        *,
        settings: AWMSettings | None = None,
        containment: bwrap.Containment | None = None,
        **options: Any,
    ):
        if max_servers is not None:
            options["max_servers"] = max_servers
        self.settings = settings = (settings or AWMSettings()).replace(**options)
        if settings.max_servers < 1:
            raise PoolError(f"max_servers must be >= 1, got {settings.max_servers}")
        self.max_servers, self.rewards = settings.max_servers, settings.rewards
        self.containment = containment or bwrap.require_containment(settings.unsafe_no_sandbox)
        self.root = hostio.make_run_dir("echo_trl_awm_pool_")  # episode.remove_stale_dirs() knows this dir
        (self.root / "sessions").mkdir()
        self.stats = PoolStats()
        self._scenarios: dict[str, Scenario] = {}
        self._prepared: dict[str, _Prepared] = {}
        self._slots: dict[int, _Slot] = {}
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        self._cond = threading.Condition()
        self._prepare_lock = threading.Lock()
        self._open_sessions: dict[str, int] = {}  # scenario -> sessions (episodes) open now
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._slots, self.root)

    # -- scenarios ---------------------------------------------------------------------------

    def add(self, scenario: Scenario) -> None:
        """Make ``scenario`` available (nothing starts until it is used)."""
        scenario.require("env_code")
        with self._cond:
            known = self._scenarios.get(scenario.name)
            if known is not None and known is not scenario:
                raise PoolError(f"another scenario named {scenario.name!r} is already in the pool")
            self._scenarios[scenario.name] = scenario

    def scenario(self, name: str) -> Scenario:
        try:
            return self._scenarios[name]
        except KeyError:
            raise PoolError(f"scenario {name!r} is not in the pool (known: {sorted(self._scenarios)})") from None

    def _prepare(self, name: str) -> _Prepared:
        """The scenario's initial snapshot and tool list, from its first server (started here if needed)."""
        with self._prepare_lock:
            if name not in self._prepared:
                with self._lease(name, None) as slot:
                    assert slot.runtime is not None
                    self._prepared[name] = _Prepared(slot.runtime.snapshot, slot.runtime.tools)
            return self._prepared[name]

    def tools(self, name: str) -> list[dict[str, Any]]:
        """The scenario's MCP tools (starts its first server if none ran yet)."""
        return self._prepare(name).tools

    # -- leases ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lease(self, name: str, occupant: str | None, notes: list[str] | None = None) -> Iterator[_Slot]:
        scenario = self.scenario(name)
        slot = self._acquire(scenario, occupant, notes)
        try:
            yield slot
        finally:
            with self._cond:
                slot.state.in_use = False
                slot.state.last_used = next(self._clock)
                self._cond.notify_all()

    def _acquire(self, scenario: Scenario, occupant: str | None, notes: list[str] | None = None) -> _Slot:
        """A server of ``scenario`` for ``occupant``; a server found dead is replaced (and ``notes`` says so)."""
        deadline = time.monotonic() + self.settings.wait_timeout
        while True:
            victim = None
            with self._cond:
                if self._closed:
                    raise PoolError("the server pool is closed")
                decision = choose_slot(
                    [s.state for s in self._slots.values()], scenario.name, occupant, self.max_servers
                )
                if decision.action == "wait":
                    self.stats.waits += 1
                    if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise PoolError(
                            f"no server for scenario {scenario.name!r} came free within "
                            f"{self.settings.wait_timeout:g}s (max_servers={self.max_servers}, all in use)"
                        )
                    continue
                if decision.action == "reuse":
                    slot = self._slots[decision.slot]
                    slot.state.in_use = True
                else:
                    if decision.evict is not None:
                        victim = self._slots.pop(decision.evict)
                        self.stats.evictions += 1
                    slot = _Slot(SlotState(next(self._ids), scenario.name, in_use=True))
                    self._slots[slot.state.id] = slot  # reserved: counts against the bound while it starts
            if decision.action == "reuse":
                if slot.runtime is not None and slot.runtime.server is not None and slot.runtime.server.alive():
                    return slot
                if notes is not None and slot.runtime is not None and slot.runtime.server is not None:
                    notes.append(f"{slot.runtime.server.exit_description()}; restarted")
                self._drop(slot)  # its server died since: start another
                continue
            if victim is not None:
                _close_slot(victim)
            try:
                self._start(slot, scenario)
            except BaseException:
                self._drop(slot)
                raise
            return slot

    def _start(self, slot: _Slot, scenario: Scenario) -> None:
        t0 = time.perf_counter()
        try:
            slot.runtime = AWMRuntime(scenario, settings=self.settings, containment=self.containment).start()
            slot.mcp = slot.runtime._session()
        except MCPError as exc:
            raise ScenarioError(
                f"MCP handshake with the scenario server failed: {exc}", scenario=scenario.name
            ) from None
        self.stats.starts += 1
        self.stats.start_seconds.append(time.perf_counter() - t0)
        if slot.runtime.build_report is not None:
            self.stats.databases[scenario.name] = slot.runtime.build_report.summary()

    def warm(self, name: str, servers: int | None = None) -> int:
        """Start servers of ``name`` in the background up to ``servers`` (default: one per open session) within the
        bound, evicting none; returns how many. A starting server counts as busy: a call waits for it or starts one."""
        scenario = self.scenario(name)
        with self._cond:
            target = self._open_sessions.get(name, 0) if servers is None else servers
            have = sum(s.state.scenario == name for s in self._slots.values())
            n = 0 if self._closed else max(0, min(target - have, self.max_servers - len(self._slots)))
            slots = [_Slot(SlotState(next(self._ids), name, in_use=True)) for _ in range(n)]
            self._slots.update((slot.state.id, slot) for slot in slots)  # reserved against the bound
        for slot in slots:
            threading.Thread(target=self._start_spare, args=(slot, scenario), daemon=True, name="awm-warm").start()
        return n

    def _start_spare(self, slot: _Slot, scenario: Scenario) -> None:
        try:
            self._start(slot, scenario)
        except BaseException:  # the call that needs a server starts one (and reports why it cannot)
            self._drop(slot)
            return
        with self._cond:
            slot.state.in_use, slot.state.last_used = False, next(self._clock)
            self._cond.notify_all()
            closed = self._closed  # closed while it started: the shutdown did not see its process
        if closed:
            _close_slot(slot)

    def _drop(self, slot: _Slot) -> None:
        with self._cond:
            self._slots.pop(slot.state.id, None)
            self._cond.notify_all()
        _close_slot(slot)

    # -- sessions ----------------------------------------------------------------------------

    def new_episode(
        self,
        scenario: str,
        task_idx: int | None = None,
        *,
        task: str | None = None,
        format_error_ends_episode: bool = False,
    ) -> Episode:
        """A fresh episode of ``scenario`` on its own copy of the initial database."""
        if self._closed:
            raise PoolError("the server pool is closed")
        if task is None:
            if task_idx is None:
                raise ValueError("give task_idx or task")
            task = self.scenario(scenario).task(task_idx)
        prepared = self._prepare(scenario)
        session = PooledSession(self, scenario, self.root / "sessions" / f"{uuid.uuid4().hex}.db")
        session.write(prepared.snapshot)
        with self._cond:
            self._open_sessions[scenario] = self._open_sessions.get(scenario, 0) + 1
        view = PooledRuntime(self, self.scenario(scenario), prepared, session, format_error_ends_episode)
        episode = Episode(view, task, task_idx, session)  # type: ignore[arg-type]
        session.notes = episode.notes  # a server replaced during the episode is noted in its record
        return episode

    def call_tool(
        self, session: PooledSession, name: str, arguments: dict[str, Any], timeout: float | None
    ) -> ToolOutcome:
        """One tool call of ``session`` on a leased server holding the session's database."""
        with self._lease(session.scenario, session.id, session.notes) as slot:
            assert slot.runtime is not None and slot.runtime.server is not None
            if slot.mcp is None:  # the last call on this server failed (e.g. timed out): a fresh MCP session
                slot.mcp = slot.runtime._session()
            server = session.server = slot.runtime.server
            try:
                if slot.state.occupant != session.id:
                    slot.state.occupant = None
                    server.load_database(session.read())
                    slot.state.occupant = session.id
                    self.stats.restores += 1
            except DatabaseUnavailable as exc:
                server.stop()  # its live database is in an unknown state: the next lease starts another
                raise MCPError(f"could not load the session's database into the scenario server: {exc}") from None
            try:
                out = slot.mcp.call_tool(name, arguments, timeout=timeout)
            except BaseException as exc:
                slot.state.occupant = None  # unknown state: restore before the next call
                if isinstance(exc, CallTimedOut):  # it may still be computing: stopped (the episode notes it)
                    server.stop()
                else:
                    with contextlib.suppress(Exception):
                        session.write(server.save_database())
                with contextlib.suppress(Exception):  # a failed call leaves its MCP session unusable
                    slot.mcp.close()
                slot.mcp = None
                raise
            try:
                session.write(server.save_database())
            except DatabaseUnavailable as exc:
                slot.state.occupant = None
                server.stop()
                raise MCPError(f"could not save the session's database from the scenario server: {exc}") from None
            return out

    def release(self, session: PooledSession) -> None:
        """Forget ``session``: its database copy is removed (servers that held it keep running)."""
        with self._cond:
            for slot in self._slots.values():
                if slot.state.occupant == session.id:
                    slot.state.occupant = None
            self._open_sessions[session.scenario] -= not session.released
            session.released = True
        session.db.unlink(missing_ok=True)  # a host-private file the host wrote

    # -- introspection / lifecycle -------------------------------------------------------------

    def live_servers(self) -> list[tuple[str, int]]:
        """(scenario, server pid) of every live server, for monitoring and benchmarks."""
        with self._cond:
            return [
                (s.state.scenario, s.runtime.server.proc.pid)
                for s in self._slots.values()
                if s.runtime is not None and s.runtime.server is not None and s.runtime.server.proc is not None
            ]

    def close(self) -> None:
        """Stop every server and remove the pool's temp dir; idempotent, never raises."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_slot(slot: _Slot) -> None:
    if slot.mcp is not None:
        slot.mcp.close()
    if slot.runtime is not None:
        slot.runtime.close()


class PooledSession:
    """The MCP-session side of a pooled episode: each call goes through the pool."""

    def __init__(self, pool: ServerPool, scenario: str, db: Path):
        self.pool, self.scenario, self.db, self.id, self.released = pool, scenario, db, db.stem, False
        self.server = None  # the server of the last call (the episode reports its state on failures)
        self.notes: list[str] = []

    def read(self) -> bytes:
        """The session's database image (a file in the pool's private dir, written only by the host)."""
        fd = hostio.open_regular(self.db)
        try:
            return hostio.read_bounded(fd, MAX_IMAGE_BYTES, str(self.db))
        finally:
            os.close(fd)

    def write(self, image: bytes) -> None:
        """Replace the session's database image (written whole to a new private file, then renamed over it)."""
        write_file(self.db, image, durable=False, mode=0o600)

    def call_tool(self, name: str, arguments: dict[str, Any], *, timeout: float | None = None) -> ToolOutcome:
        try:
            return self.pool.call_tool(self, name, arguments, timeout)
        except (PoolError, ScenarioError) as exc:  # no server for the call: an environment failure of this episode
            raise MCPError(str(exc)) from None

    def close(self) -> None:
        self.pool.release(self)


class PooledRuntime:
    """What an :class:`Episode` needs of its runtime, for one pooled session."""

    def __init__(
        self,
        pool: ServerPool,
        scenario: Scenario,
        prepared: _Prepared,
        session: PooledSession,
        format_error_ends_episode: bool,
    ):
        self.pool, self.scenario, self.session = pool, scenario, session
        self.tools, self.snapshot = prepared.tools, prepared.snapshot  # snapshot: the initial image
        self.rewards, self.containment, self.tool_timeout = pool.rewards, pool.containment, pool.settings.tool_timeout
        self.verifier_mode = pool.settings.verifier_mode
        self.format_error_ends_episode = format_error_ends_episode

    @property
    def server(self):
        return self.session.server

    def run_verifier(
        self,
        task_idx: int | None,
        *,
        final_answer: str | None = None,
        task: str = "",
        trajectory: list[dict[str, Any]] | None = None,
    ) -> VerifyOutcome:
        """The task's verifier on the session's own database copy (no server needed)."""
        settings = self.pool.settings
        return verify_databases(
            self.scenario,
            task_idx,
            self.snapshot,
            self.session.read,
            verifier_mode=settings.verifier_mode,
            timeout=settings.verifier_timeout,
            judge=settings.judge,
            containment=self.containment,
            final_answer=final_answer,
            task=task,
            trajectory=trajectory,
        )
