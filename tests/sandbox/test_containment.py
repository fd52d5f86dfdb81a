"""Adversarial scenarios: generated code that tries to escape, or to reach the host through what it can write.

A copy of the bundled ``library_1`` scenario gets planted code (``tests/helpers/awm_attacks.py``): a ``probe``
tool with one attack per name, a verifier for task 1 with one attack per ``final_answer``, and
code run at the server's import. The ``attack`` fixture runs the probes through ``echo-trl
capture`` in this process; ``hostile`` runs a capture in a subprocess that holds a login-like
session keyring with a secret key (and whose address space is capped, so an unbounded read
fails instead of exhausting the machine). Each attack ends in an error observation and the
capture ends normally (exit 0); every test also checks the host independently: the secret bytes
in no episode, host files unchanged, nothing left running or on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from helpers.awm_attacks import (
    AT_IMPORT,
    CAPTURE_WITH_KEYRING,
    POOL_HOST,
    REPO,
    Listener,
    capture_args,
    episodes,
    kill_9_and_check,
    marker_processes,
    owned_runtime_dirs,
    report_of,
    run_capture,
    scenario_copy,
    scripts,
    secret_db,
)
from helpers.processes import descendant_pids

from echo_trl.commands.capture import command as capture
from echo_trl.envs.awm.runtime.episode import remove_stale_dirs
from echo_trl.sandbox import bwrap as sandbox

CONTAINMENT = sandbox.detect_containment()
pytestmark = pytest.mark.skipif(
    not CONTAINMENT.contained, reason=f"no containment on this host: {' '.join(CONTAINMENT.notes)}"
)

PROBES = [
    "shadow",
    "secret",
    "proc_sys",
    "dev",
    "outside",
    "unix",
    "tcp",
    "ps",
    "forks",
    "memory",
    "daemon",
    "sleep",
    "syscalls",
    "mounts",
    "disk",
    "huge_reply",
]
ATTACK_STEPS = [(p, None) for p in PROBES] + [
    ("", "plain"),  # the verifier's own probes
    ("", "log_secret"),  # the verifier links its log to a mode-600 file and crashes
    ("db_symlink", "plain"),  # the live database -> a mode-600 database of the host's, then verified ...
    ("", None),  # ... and reset
    ("stdout", None),  # the log at its file-size cap ...
    ("app_symlink", None),  # ... the server links its app file to a host path and exits ...
    ("", None),  # ... and the next episode restarts it (with a log it can write again)
]


@pytest.fixture(scope="module")
def attack(tmp_path_factory):
    """Run every probe (one episode each) and the verifier attacks through ``echo-trl capture``."""
    tmp = tmp_path_factory.mktemp("attack")
    marker = f"echo_trl_probe_{uuid.uuid4().hex[:12]}"
    secret = tmp / "secret.txt"
    secret.write_text(f"TOP-SECRET-{marker}")
    os.chmod(secret, 0o600)
    secret_db_hash = secret_db(tmp / "secret.db", marker)
    listener = Listener(tmp / "host.sock")
    conf = {
        "secret": str(secret),
        "secret_db": str(tmp / "secret.db"),
        "pth": str(tmp / "planted.pth"),
        "unix": str(tmp / "host.sock"),
        "port": listener.port,
        "marker": marker,
        "outside": str(tmp / "outside.txt"),
    }
    data = scenario_copy(tmp / "scenarios", conf)
    replay = tmp / "replay.jsonl"
    replay.write_text("".join(json.dumps(s) + "\n" for s in scripts(*ATTACK_STEPS)))
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    before = descendant_pids()
    out = tmp / "out"
    t0 = time.perf_counter()
    try:  # a capture that fails keeps the episodes it wrote: each test checks its own
        rc = capture.main(capture_args(data, replay, out, len(ATTACK_STEPS))[1:])
    except Exception as exc:
        rc = f"{type(exc).__name__}: {exc}"[:3000]
    seconds = time.perf_counter() - t0
    time.sleep(0.3)
    listener.close()
    yield {
        "rc": rc,
        "steps": ATTACK_STEPS,
        "episodes": episodes(out),
        "log": (out / "capture_log.txt").read_text() if (out / "capture_log.txt").exists() else "",
        "marker": marker,
        "secret": secret.read_text(),
        "secret_db_hash": secret_db_hash,
        "listener": listener,
        "conf": conf,
        "core_pattern": core_pattern,
        "leftover_pids": descendant_pids() - before,
        "marker_pids": marker_processes(marker),
        "our_dirs": owned_runtime_dirs(os.getpid()),
        "seconds": seconds,
        "raw": "\n".join(f.read_text() for f in out.glob("*.jsonl")),
    }


def _episode(run: dict, label: str, after: int = 0) -> dict:
    """The episode of the step labelled ``probe/verifier mode`` (episodes are written in step order),
    or the one ``after`` steps later."""
    (i,) = [i for i, (p, m) in enumerate(run["steps"]) if f"{p}/{m}" == label]
    return run["episodes"][i + after]


def _served_by_a_live_server(episode: dict) -> bool:
    """Every step of ``episode`` was answered by a running scenario server (no environment failure):
    after the previous episode's server exited or was stopped, that means a new one was started."""
    return all("environment failure" not in str(s["observation"].get("error", "")) for s in episode["steps"])


def _error_text(obs: dict) -> str:
    """An error observation's text: a tool step's ``error``, or a verify step's ``error_message``."""
    return str(obs.get("error") or obs.get("verify_result", {}).get("error_message") or "")


def _probe(attack, name: str) -> dict:
    return _episode(attack, f"{name}/None")["steps"][0]["observation"]


def _blocked(attack, name: str) -> str:
    """The probe's own report (the 400 detail): it must say it did not escape; returns its error."""
    return report_of(_probe(attack, name))


def test_capture_ran_contained_and_ended_cleanly(attack):
    assert attack["rc"] == 0
    assert len(attack["episodes"]) == len(ATTACK_STEPS)
    assert "containment: bubblewrap" in attack["log"] and "unsafe-no-sandbox: no" in attack["log"]


@pytest.mark.parametrize("name", ["shadow", "secret"])
def test_host_files_are_not_readable(attack, name):
    text = _blocked(attack, name)
    assert "FileNotFoundError" in text  # not even there: the sandbox has no host /etc or /tmp
    assert attack["secret"] not in attack["raw"]


def test_kernel_settings_and_dev_are_not_writable(attack):
    assert _blocked(attack, "proc_sys").startswith(("PermissionError", "OSError"))  # owned by host root, ro
    assert "Read-only file system" in _blocked(attack, "dev")
    assert Path("/proc/sys/kernel/core_pattern").read_text() == attack["core_pattern"]
    assert not Path("/dev", attack["marker"]).exists()


def test_no_write_outside_the_episode_dir(attack):
    _blocked(attack, "outside")
    assert not Path(attack["conf"]["outside"]).exists() and not Path("/escape.txt").exists()


def test_no_host_socket_or_loopback_tcp(attack):
    assert "FileNotFoundError" in _blocked(attack, "unix")
    _blocked(attack, "tcp")
    assert attack["listener"].accepted == 0


def test_host_processes_are_invisible(attack):
    visible = json.loads(_blocked(attack, "ps").split(": ", 1)[1])["visible"]
    assert visible and not any("pytest" in line for line in visible)
    assert len(visible) < 10, visible  # the sandbox's own few processes, not the host's


def test_forks_and_memory_are_capped(attack):
    text = _blocked(attack, "forks")
    assert "BlockingIOError" in text or "Resource temporarily unavailable" in text
    assert "MemoryError" in _blocked(attack, "memory")


def test_sleeping_forever_times_out_and_stdout_flood_hits_the_file_size_cap(attack):
    sleep = _probe(attack, "sleep")
    assert sleep["reward_type"] == "timeout" and sleep["done"]
    assert "File too large" in _blocked(attack, "stdout")  # RLIMIT_FSIZE (Python ignores SIGXFSZ: EFBIG)


def test_verifier_is_contained_too(attack):
    probes = _episode(attack, "/plain")["steps"][-1]["observation"]["verify_result"]["raw_result"]["probes"]
    assert probes and all(v not in ("escaped", True) for v in probes.values()), probes
    assert not Path(attack["conf"]["outside"] + ".v").exists()


def test_nothing_left_running_or_on_disk(attack):
    assert "daemon started" in _probe(attack, "daemon")["error"]
    assert attack["leftover_pids"] == set()
    assert attack["marker_pids"] == []  # the double-forked, setsid daemon died with its sandbox
    assert attack["our_dirs"] == []


# ---- what the sandbox can write never reaches the host ----------------------------------------


def test_kernel_surfaces_are_denied_by_the_seccomp_filter(attack):
    errors = json.loads(_blocked(attack, "syscalls").split(": ", 1)[1])
    # unshare(0), keyctl(GET_KEYRING_ID) and userfaultfd(USER_MODE_ONLY) succeed without a filter;
    # setns(-1), ptrace(PEEKUSER, no such pid), perf_event_open(NULL) ... fail with other errors
    assert errors == {name: "EPERM" for name in errors} and len(errors) == 18, errors


def test_the_writable_dir_is_nosuid_nodev_so_a_setuid_plant_is_inert(attack):
    report = json.loads(_blocked(attack, "mounts").split(": ", 1)[1])
    assert report["setuid_bit"]  # the plant was made ...
    assert report["nosuid"] and report["nodev"], report  # ... where the kernel ignores it


def test_the_writable_dir_is_capped_per_session(attack):
    report = json.loads(_blocked(attack, "disk").split(": ", 1)[1])
    assert report["error"] == "No space left on device", report
    assert sandbox.SERVER_LIMITS.disk - (32 << 20) <= report["written"] <= sandbox.SERVER_LIMITS.disk


def test_a_huge_tool_reply_is_cut_at_the_cap_and_the_episode_kept(attack):
    obs = _probe(attack, "huge_reply")
    assert obs["reward_type"] == "server_error" and "cap on tool replies" in obs["error"], obs["error"][:300]
    line = next(line for line in attack["raw"].splitlines() if "cap on tool replies" in line)
    assert len(line) < (1 << 20)  # the 12 MB reply is in no episode


def test_a_linked_app_file_is_never_written_through_at_the_restart(attack):
    assert "the scenario server exited" in _probe(attack, "app_symlink")["error"]
    assert _served_by_a_live_server(_episode(attack, "app_symlink/None", after=1))  # a restart, no file written
    assert not Path(attack["conf"]["pth"]).exists()  # the host wrote no code to the link's target


def test_a_linked_live_database_reaches_no_host_database(attack):
    last = _episode(attack, "db_symlink/plain")["steps"][-1]["observation"]
    # the verifier ran on the session's own database, or the server could not hand its database over
    assert not last.get("verify_result", {}).get("raw_result", {}).get("probes", {}).get("final_has_secret"), last
    assert "verify_result" in last or last["reward_type"] == "server_error", last
    assert hashlib.sha256(Path(attack["conf"]["secret_db"]).read_bytes()).hexdigest() == attack["secret_db_hash"]
    assert f"DB-SECRET-{attack['marker']}" not in attack["raw"]


def test_a_verifier_cannot_make_the_host_read_its_log_through_a_link(attack):
    verify = _episode(attack, "/log_secret")["steps"][-1]["observation"]
    assert verify["metadata"]["error_type"] == "VerifierCrashed" and "exit code 3" in str(verify)
    assert attack["secret"] not in attack["raw"]


# ---- a capture in its own process: keyring, odd verifier results, a corrupted database ------------

HOSTILE_STEPS = [
    ("keyring", None),
    ("corrupt_db", "plain"),
    ("", None),
    ("", "json_list"),
    ("", "deep"),
    ("", "surrogate"),
    ("", "result_fifo"),
    ("", "log_dev_zero"),
    ("nested_dirs", None),
]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    marker = f"echo_trl_probe_{uuid.uuid4().hex[:12]}"
    conf = {"secret": "/nonexistent", "marker": marker, "key": f"echo_trl_test_key_{marker}"}
    conf.update(unix="/nonexistent.sock", port=9, outside="/nonexistent")
    data = scenario_copy(tmp / "scenarios", conf)
    replay = tmp / "replay.jsonl"
    replay.write_text("".join(json.dumps(s) + "\n" for s in scripts(*HOSTILE_STEPS)))
    secret = f"KEY-SECRET-{marker}"
    out = tmp / "out"
    proc = run_capture(capture_args(data, replay, out, len(HOSTILE_STEPS), 10), timeout=300, key=(conf["key"], secret))
    raw = "\n".join(f.read_text() for f in out.glob("*.jsonl")) if out.exists() else ""
    return {
        "proc": proc,
        "steps": HOSTILE_STEPS,
        "episodes": episodes(out) if out.exists() else [],
        "raw": raw,
        "secret": secret,
        "left_dirs": owned_runtime_dirs(proc.pid),
    }


def test_the_hostile_capture_ends_cleanly_with_every_episode_kept(hostile):
    proc = hostile["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(hostile["episodes"]) == len(HOSTILE_STEPS) and "Traceback" not in proc.stderr


def test_the_hosts_session_keyring_is_out_of_reach(hostile):
    report = json.loads(_blocked(hostile, "keyring").split(": ", 1)[1])
    assert report["search"] == 1 and report["keys"] == "", report  # EPERM; no key of anyone's in /proc/keys
    assert hostile["secret"] not in hostile["raw"]


def test_a_corrupted_live_database_is_an_error_observation_and_the_next_episode_restarts(hostile):
    assert hostile["proc"].returncode == 0, hostile["proc"].stderr[-3000:]
    last = _episode(hostile, "corrupt_db/plain")["steps"][-1]["observation"]
    assert last["reward_type"] in ("server_error", "judge_error") and _error_text(last), last
    assert _served_by_a_live_server(_episode(hostile, "corrupt_db/plain", after=1))


@pytest.mark.parametrize(
    ("mode", "error_type", "reason"),
    [
        ("json_list", "InvalidResult", "a JSON list"),
        ("deep", "InvalidResult", "nested too deeply"),
        ("result_fifo", "VerifierCrashed", "without a result"),
        ("log_dev_zero", "VerifierCrashed", "exit code 3"),
    ],
)
def test_odd_verifier_results_are_error_observations(hostile, mode, error_type, reason):
    assert hostile["proc"].returncode == 0, hostile["proc"].stderr[-3000:]
    verify = _episode(hostile, f"/{mode}")["steps"][-1]["observation"]
    assert verify["reward_type"] == "judge_error" and verify["metadata"]["error_type"] == error_type
    assert reason in verify["verify_result"]["error_message"] and len(json.dumps(verify)) < 10_000


def test_a_lone_surrogate_in_a_verifier_result_is_written_as_a_replacement_character(hostile):
    assert hostile["proc"].returncode == 0, hostile["proc"].stderr[-3000:]
    verify = _episode(hostile, "/surrogate")["steps"][-1]["observation"]
    assert verify["verify_result"]["raw_result"]["note"] == "\ufffd"


def test_3000_nested_directories_never_block_later_runs(hostile):
    assert hostile["proc"].returncode == 0, hostile["proc"].stderr[-3000:]
    assert "3000 nested" in _probe(hostile, "nested_dirs")["error"]
    assert not hostile["left_dirs"]  # nothing left behind ...
    remove_stale_dirs()  # ... and the next run's clean-up has nothing that fails


# ---- module-level attacks, kill -9, a runtime under /tmp ---------------------------------------


@pytest.mark.parametrize("attack_at_import", ["ready_fifo", "ready_dev_zero"])
def test_a_ready_marker_the_server_controls_cannot_hang_or_flood_the_host(tmp_path, attack_at_import):
    conf = {"marker": "x", "secret": "/nonexistent", "unix": "/nonexistent", "port": 9, "outside": "/nonexistent"}
    data = scenario_copy(tmp_path / "scenarios", conf, AT_IMPORT[attack_at_import])
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps(s) + "\n" for s in scripts(("ps", None))))
    proc = run_capture(capture_args(data, replay, tmp_path / "out", 1), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (ep,) = episodes(tmp_path / "out")
    obs = ep["steps"][0]["observation"]
    assert "Response: " in obs.get("error", ""), obs  # the server started and answered (the probe's HTTP error)


def _daemon_scenario(tmp_path: Path) -> tuple[Path, str]:
    marker = f"echo_trl_probe_{uuid.uuid4().hex[:12]}"
    conf = {"marker": marker, "secret": "/nonexistent", "unix": "/nonexistent", "port": 9, "outside": "/nonexistent"}
    return scenario_copy(tmp_path / "scenarios", conf, AT_IMPORT["daemon"]), marker


def test_kill_9_of_a_capture_leaves_no_sandboxed_process(tmp_path):
    data, marker = _daemon_scenario(tmp_path)
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps(s) + "\n" for s in scripts(("sleep", None))))
    env = {**os.environ, "PYTHONPATH": str(REPO), "ECHO_TRL_PROGRESS": "0"}
    args = capture_args(data, replay, tmp_path / "out", 1, timeout=600)
    proc = subprocess.Popen(
        [sys.executable, "-c", CAPTURE_WITH_KEYRING, "k", "v", *args], env=env, cwd=str(REPO), stderr=subprocess.PIPE
    )
    try:
        kill_9_and_check(proc, marker)
    finally:
        proc.kill()


def test_kill_9_of_an_online_training_process_leaves_no_pooled_server(tmp_path):
    data, marker = _daemon_scenario(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ECHO_TRL_PROGRESS": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", POOL_HOST, str(data)], env=env, cwd=str(REPO), stderr=subprocess.PIPE
    )
    try:
        kill_9_and_check(proc, marker)
    finally:
        proc.kill()


def test_a_python_runtime_and_a_checkout_under_tmp_run_sandboxed():
    base = Path(tempfile.mkdtemp(prefix="echo_trl_tmp_runtime_", dir="/tmp"))
    try:
        venv, checkout = base / "venv", base / "checkout"
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
        )
        shutil.copytree(REPO / "echo_trl", checkout / "echo_trl", ignore=shutil.ignore_patterns("__pycache__"))
        code = (
            "import json, sys, echo_trl\n"
            "from echo_trl.envs.awm.runtime.episode import AWMRuntime\n"
            "from echo_trl.envs.awm.scenario.source import ScenarioSource\n"
            f"rt = AWMRuntime(ScenarioSource.from_dir({str(REPO / 'data' / 'awm_scenarios')!r}).load('library_1'))\n"
            "with rt:\n"
            "    obs = rt.new_episode(0).call_tool('get_member', {'member_id': 1})\n"
            "    print(json.dumps({'module': echo_trl.__file__, 'python': sys.executable,\n"
            "                      'reward_type': obs['reward_type'], 'containment': rt.containment.applied()[0]}))\n"
        )
        env = {"PATH": os.environ["PATH"], "ECHO_TRL_PROGRESS": "0", "HOME": str(base)}
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", code],
            cwd=str(checkout),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["module"].startswith(str(checkout)) and result["python"].startswith(str(venv))
        assert result["reward_type"] == "tool_call_ok" and result["containment"].startswith("bubblewrap")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_setuid_plant_never_lands_where_a_host_user_could_run_it(tmp_path):
    """While the server runs, nothing it wrote is on the host: no file of the sandbox uid, no setuid bit, in
    the runtime's directory (it used to hold the episode dir, owned by the uid every sandbox shares)."""
    from echo_trl.envs.awm.runtime.episode import AWMRuntime
    from echo_trl.envs.awm.scenario.source import ScenarioSource

    conf = {"marker": "x", "secret": "/nonexistent", "unix": "/nonexistent", "port": 9, "outside": "/nonexistent"}
    data = scenario_copy(tmp_path / "scenarios", conf)
    with AWMRuntime(ScenarioSource.from_dir(data).load("library_1"), tool_timeout=20.0) as rt:
        report = json.loads(report_of(rt.new_episode(1).call_tool("probe", {"name": "mounts"})).split(": ", 1)[1])
        assert report["setuid_bit"]  # planted, inside
        found = [
            (str(p), st.st_uid, oct(st.st_mode))
            for p in [rt.root, *rt.root.rglob("*")]
            if (st := os.lstat(p)).st_uid == sandbox.SANDBOX_UID or st.st_mode & 0o6000
        ]
        assert found == []
