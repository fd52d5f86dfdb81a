"""The scenario server pool: the pure LRU policy, then real servers (library_1 + content_platform_1)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers.processes import descendant_pids
from helpers.shared_data import AWM1K_SAMPLES, require_shared
from hypothesis import given
from hypothesis import strategies as st

from echo_trl.envs.awm.runtime.pool import Decision, PoolError, ServerPool, SlotState, choose_slot
from echo_trl.envs.awm.scenario.source import ScenarioSource

REPO = Path(__file__).resolve().parents[4]

# -- the policy --------------------------------------------------------------------------------


def test_reuses_an_idle_server_of_the_scenario_preferring_the_sessions_own_database():
    slots = [SlotState(0, "a", last_used=5), SlotState(1, "a", last_used=9, occupant="s1"), SlotState(2, "b")]
    assert choose_slot(slots, "a", "s1", bound=3) == Decision("reuse", slot=1)
    slots[1].occupant = "other"
    assert choose_slot(slots, "a", "s1", bound=3) == Decision("reuse", slot=1)  # most recent idle one
    slots[1].in_use = True
    assert choose_slot(slots, "a", "s1", bound=3) == Decision("reuse", slot=0)


def test_starts_under_the_bound_and_evicts_the_least_recently_used_idle_server_at_it():
    slots = [SlotState(0, "a", last_used=7), SlotState(1, "b", last_used=3), SlotState(2, "c", last_used=5)]
    assert choose_slot(slots, "d", None, bound=4) == Decision("start")
    assert choose_slot(slots, "d", None, bound=3) == Decision("start", evict=1)
    slots[1].in_use = True  # never one in use: the next least recently used goes
    assert choose_slot(slots, "d", None, bound=3) == Decision("start", evict=2)


def test_waits_when_every_server_is_busy_or_its_scenario_is():
    busy = [SlotState(0, "a", in_use=True), SlotState(1, "b", in_use=True)]
    assert choose_slot(busy, "c", None, bound=2) == Decision("wait")
    # at the bound with the scenario's own server busy: wait for it rather than evict another
    mixed = [SlotState(0, "a", in_use=True), SlotState(1, "b", last_used=1)]
    assert choose_slot(mixed, "a", None, bound=2) == Decision("wait")
    assert choose_slot(mixed, "a", None, bound=3) == Decision("start")  # room: a second server of "a"
    with pytest.raises(ValueError, match="max_servers must be >= 1"):
        choose_slot([], "a", None, bound=0)


@given(st.integers(1, 4), st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans()), max_size=60))
def test_simulated_workload_keeps_the_bound_and_never_evicts_a_server_in_use(bound, ops):
    """Apply the policy's decisions to a simulated pool: acquire (scenario, hold it?) / release the oldest held."""
    slots: dict[int, SlotState] = {}
    held: list[int] = []
    clock, next_id = 0, 0
    for scenario, hold in ops:
        d = choose_slot(list(slots.values()), scenario, None, bound)
        if d.action == "wait":
            assert (
                all(s.in_use for s in slots.values())
                or any(s.scenario == scenario for s in slots.values())
                and len(slots) == bound
            )
            if held:  # the busy call ends
                slots[held.pop(0)].in_use = False
            continue
        if d.action == "reuse":
            slot = slots[d.slot]
            assert slot.scenario == scenario and not slot.in_use
        else:
            if d.evict is not None:
                victim = slots.pop(d.evict)
                assert not victim.in_use
                idle = [s.last_used for s in slots.values() if not s.in_use]
                assert all(victim.last_used <= t for t in idle)  # least recently used
            else:
                assert len(slots) < bound
            assert not any(s.scenario == scenario and not s.in_use for s in slots.values())
            slot = slots[next_id] = SlotState(next_id, scenario)
            next_id += 1
        assert len(slots) <= bound
        clock += 1
        slot.in_use, slot.last_used = True, clock
        if hold:
            held.append(slot.id)
        else:
            slot.in_use = False


# -- real servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scenarios():
    library = ScenarioSource.from_dir(REPO / "data" / "awm_scenarios").load("library_1")
    content = ScenarioSource.from_dir(require_shared(AWM1K_SAMPLES)).load("content_platform_1")
    return library, content


def _checkout(ep) -> None:
    ep.call_tool("search_members", {"query": "Priya Raman"})
    ep.call_tool("checkout_copy", {"member_id": 1, "barcode": "31994002104119"})


def test_sessions_own_their_databases_on_one_server_under_a_bound_of_one(scenarios):
    library, content = scenarios
    children = descendant_pids()
    with ServerPool(1) as pool:
        pool.add(library)
        pool.add(content)
        a, b = pool.new_episode("library_1", 0), pool.new_episode("library_1", 0)
        c = pool.new_episode("content_platform_1", 0)
        _checkout(a)  # a checks the book out; b, on the same server, still finds the copy available
        got = b.call_tool("list_member_loans", {"member_id": 1})["tool_result"]
        assert "31994002104119" not in got
        assert len(pool.live_servers()) == 1
        assert "Kurzgesagt" in c.call_tool("search_channels", {"query": "Kurzgesagt"})["tool_result"]
        assert [s for s, _ in pool.live_servers()] == ["content_platform_1"]  # library_1's server was closed
        assert "31994002104119" in a.call_tool("list_member_loans", {"member_id": 1})["tool_result"]
        assert a.verify("done")["reward_type"] == "complete" and a.reward == 1.0
        assert b.verify()["reward_type"] == "others" and b.reward == 0.0
        assert c.verify()["reward_type"] == "no_verifier"
        assert pool.stats.evictions >= 2 and len(pool.live_servers()) == 1
        for ep in (a, b, c):
            ep.close()
        assert not list((pool.root / "sessions").iterdir())  # closed sessions leave no database behind
        root = pool.root
    assert not root.exists()
    time.sleep(0.2)
    assert descendant_pids() - children == set()


def test_a_dead_server_is_replaced_and_the_session_goes_on(scenarios):
    library, _ = scenarios
    with ServerPool(2) as pool:
        pool.add(library)
        ep = pool.new_episode("library_1", 0)
        ep.call_tool("search_members", {"query": "Priya Raman"})
        ep.call_tool("checkout_copy", {"member_id": 1, "barcode": "31994002104119"})
        ((_, pid),) = pool.live_servers()
        os.killpg(pid, signal.SIGKILL)
        time.sleep(0.2)
        obs = ep.call_tool("list_member_loans", {"member_id": 1})  # a new server, the session's own database
        assert obs["reward_type"] == "tool_call_ok" and "31994002104119" in obs["tool_result"]
        assert pool.live_servers()[0][1] != pid
        assert ep.verify()["reward_type"] == "complete"
        ep.close()


def test_no_server_free_in_time_is_an_environment_failure_of_that_episode(scenarios):
    library, content = scenarios
    with ServerPool(1, wait_timeout=0.5) as pool:
        pool.add(library)
        pool.add(content)
        ep = pool.new_episode("content_platform_1", 0)
        pool.tools("library_1")
        entered, leave = threading.Event(), threading.Event()

        def hold():
            with pool._lease("library_1", None):
                entered.set()
                leave.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        entered.wait(10)
        try:
            obs = ep.call_tool("search_channels", {"query": "K"})
        finally:
            leave.set()
            t.join()
        assert obs["reward_type"] == "server_error" and obs["done"]
        assert "no server for scenario 'content_platform_1' came free within 0.5s" in obs["error"]
        ep.close()
    with pytest.raises(PoolError, match="closed"):
        pool.new_episode("library_1", 0)
    with pytest.raises(PoolError, match="max_servers must be >= 1"):
        ServerPool(0)


def test_benchmark_smoke(capsys):
    """benchmarks/environments/awm_pool.py's cheapest path: the JSON it prints, rewards checked under swapping."""
    import json

    from helpers.bench import importable_benchmarks

    importable_benchmarks()
    import awm_pool

    out = awm_pool.main(
        ["--json", "--scenarios", "2", "--pools", "1", "2", "--episodes", "2", "--prompts", "2", "--generations", "1"]
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert set(out["per_pool"]) == {"1", "2"}
    assert all(r["all_rewards_complete"] and r["episodes_per_s"] > 0 for r in out["per_pool"].values())
    assert out["per_pool"]["1"]["server_starts"] >= 2 and out["per_pool"]["2"]["server_starts"] == 0
    assert out["rss_mb_per_server"]["n"] == 2 and out["rss_mb_per_server"]["median"] > 0


def _cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of the live processes among ``pids`` (/proc/PID/stat fields 14 and 15)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def test_a_timed_out_tool_call_stops_its_server_so_no_cpu_is_burnt_after_the_timeout(tmp_path):
    from helpers.awm_attacks import scenario_copy

    data = scenario_copy(tmp_path / "data", {"secret": "", "outside": str(tmp_path / "x"), "marker": "spin-test"})
    library = ScenarioSource.from_dir(data).load("library_1")
    children = descendant_pids()
    with ServerPool(1, tool_timeout=8.0) as pool:  # the MCP handshake shares it: room on a busy machine
        pool.add(library)
        ep = pool.new_episode("library_1", 0)
        ((_, first),) = pool.live_servers()
        obs = ep.call_tool("probe", {"name": "spin"})  # `while True: pass` in the server
        assert obs["reward_type"] == "timeout" and obs["done"]
        assert any("timed out after 8s: its scenario server was stopped" in n for n in ep.notes), ep.notes
        servers = descendant_pids() - children
        before = _cpu_seconds(servers)
        time.sleep(2.0)
        burnt = _cpu_seconds(servers) - before
        # unstopped, the spinning thread took 0.29 CPU s in 1.5 s on a loaded 2-core machine (a core when idle)
        assert burnt < 0.05, f"{burnt:.2f} CPU seconds in 2 s after the timeout"
        ep.close()
        nxt = pool.new_episode("library_1", 0)  # the next episode gets a fresh server and works
        assert nxt.call_tool("search_members", {"query": "Priya Raman"})["reward_type"] == "tool_call_ok"
        assert pool.live_servers()[0][1] != first and any("restarted" in n for n in nxt.notes), nxt.notes
        nxt.close()
