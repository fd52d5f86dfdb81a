"""Run TRL's own SFT test file, offline, against TRL's ``SFTTrainer`` and against ``EchoSFTTrainer``.

    python benchmarks/conformance/trl_sft_conformance.py [--trainers trl echo echo0] [-k EXPR] [--standins DIR]
        [CLASS::TEST ...] [--jobs 3] [--log_dir DIR] [--threads 1]
    python benchmarks/conformance/trl_sft_conformance.py --from_logs DIR   # the counts of an earlier (or stopped) run

The file (``tests/fixtures/trl_sft/trl_test_sft_trainer.py``, TRL main, source and commit in ``SOURCE.md``) is
copied with its helpers into a temporary ``tests`` package under its TRL names and run with pytest, one process per
trainer for the whole file (``--jobs`` of them side by side, one torch thread each), the working directory holding
the local stand-ins of the ``trl-internal-testing`` models and datasets
(``benchmarks/conformance/trl_sft_standins.py``, built once and reused from ``--standins``; a model folder built
with other sizes is rebuilt). The trainer is the test module's ``SFTTrainer``: its ``from trl import ...
SFTTrainer`` line is pointed at a module that gives

* ``trl``: TRL's ``SFTTrainer`` as installed;
* ``echo``: ``EchoSFTTrainer`` at its default weights (observation and action weight 1);
* ``echo0``: ``EchoSFTTrainer`` at ``observation_weight=0``.

That import line is the one change to TRL's file; pytest-datadir's ``lazy_shared_datadir`` fixture is given by the
package's ``conftest.py``. The file is written against TRL main: the few private names it imports that the
installed TRL lacks get stand-ins that raise when used, so the tests needing them fail for every trainer alike.
Prints the pass count per trainer and every test that passes with ``trl`` but not with an Echo setting (exit code 1
when there is one).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "tests" / "fixtures" / "trl_sft"
sys.path.insert(0, str(HERE))

from trl_sft_standins import ORG, build  # noqa: E402

#: File here -> name in TRL's tests package.
FILES = {
    "trl_test_sft_trainer.py": "test_sft_trainer.py",
    "testing_utils.py": "testing_utils.py",
    "conftest_trl.py": "conftest.py",
}

CONFTEST = '''

# ---- added by echo_trl's benchmarks/conformance/trl_sft_conformance.py ------------------------------------
import shutil as _shutil
from pathlib import Path as _Path

import pytest as _pytest
import trl as _trl
import trl.import_utils as _iu
import trl.trainer.sft_trainer as _sft


def _absent(name):
    def raise_absent(*args, **kwargs):
        raise NotImplementedError(f"{name} is not in TRL {_trl.__version__}")

    return raise_absent


for _name in ("_chunked_cross_entropy_loss", "_patch_chunked_ce_lm_head", "dft_loss"):
    if not hasattr(_sft, _name):
        setattr(_sft, _name, _absent(_name))
for _name in ("is_joblib_available",):
    if not hasattr(_iu, _name):
        setattr(_iu, _name, lambda: False)



@_pytest.fixture
def lazy_shared_datadir(tmp_path):
    """pytest-datadir's fixture, which TRL's test run has: a copy of ``tests/data``."""
    target = tmp_path / "data"
    _shutil.copytree(_Path(__file__).parent / "data", target)
    return target
'''


#: The test module's ``SFTTrainer``: its import line (``from trl import SFTConfig, SFTTrainer``) is pointed here.
SWAP = '''"""The trainer the run tests, under TRL's name (``ECHO_TRL_CONFORMANCE``: trl, echo or echo0)."""

import os

from trl import SFTTrainer

if os.environ["ECHO_TRL_CONFORMANCE"] != "trl":
    from echo_trl import EchoSFTTrainer
    from echo_trl.sft_config import as_echo_sft_config

    class SFTTrainer(EchoSFTTrainer):  # noqa: F811
        """EchoSFTTrainer at the weights this run tests."""

        def __init__(self, model, args=None, *rest, **kwargs):
            args = as_echo_sft_config(args, model)
            if os.environ["ECHO_TRL_CONFORMANCE"] == "echo0":
                args.observation_weight = 0.0
            super().__init__(model, args, *rest, **kwargs)
'''
IMPORT = "from trl import SFTConfig, SFTTrainer\n"


def stage(tmp: Path, standins: Path) -> Path:
    """The temporary package: TRL's test file and helpers under their TRL names, the stand-ins beside it."""
    pkg = tmp / "tests"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for here, there in FILES.items():
        shutil.copy(FIXTURES / here, pkg / there)
    shutil.copy(FIXTURES / "template.jinja", pkg / "data" / "template.jinja")
    with (pkg / "conftest.py").open("a") as f:
        f.write(CONFTEST)
    (pkg / "echo_swap.py").write_text(SWAP)
    test = (pkg / "test_sft_trainer.py").read_text()
    if IMPORT not in test:
        raise SystemExit(f"the test file no longer imports the trainer as {IMPORT.strip()!r}: update the runner")
    (pkg / "test_sft_trainer.py").write_text(
        test.replace(IMPORT, "from trl import SFTConfig\n\nfrom .echo_swap import SFTTrainer\n")
    )
    (tmp / ORG).symlink_to(standins / ORG)
    return pkg


def command(mode: str, tmp: Path, pkg: Path, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The pytest command line and environment of one trainer's run: the whole file in one process."""
    report = tmp / f"{mode}.xml"
    targets = [f"{pkg / 'test_sft_trainer.py'}::{t}" for t in args.tests] or [str(pkg)]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-v",
        "-rfEs",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        *targets,
    ]
    cmd += ["-o", "addopts=", "--rootdir", str(tmp), f"--timeout={args.timeout}", "-W", "ignore"]
    if args.keyword:
        cmd += ["-k", args.keyword]
    threads = str(args.threads)
    env = {
        **os.environ,
        "ECHO_TRL_CONFORMANCE": mode,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf_home"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        # tiny models: one thread each, so runs side by side (or beside other work) never oversubscribe the cores
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
    return cmd, env


def outcomes(report: Path) -> dict[str, str]:
    """Outcome per test id (passed / failed / skipped) from one run's JUnit report (empty when it wrote none)."""
    if not report.exists():
        return {}
    result = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        tags = {child.tag for child in case}
        result[name] = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    return result


#: A ``pytest -v`` result line: ``tests/test_sft_trainer.py::CLASS::TEST[PARAMS] PASSED  [ 12%]``.
LOG_LINE = re.compile(r"^tests/test_sft_trainer\.py::(\S+(?:\[.*?\])?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")

LOG_OUTCOME = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}  # else failed


def outcomes_from_log(log: Path) -> dict[str, str]:
    """Outcome per test id from one trainer's ``-v`` log, also of a run stopped part way (an error in teardown
    after a pass counts as failed, as in the JUnit report)."""
    result: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = LOG_LINE.match(line)
        if m:
            kind = LOG_OUTCOME.get(m[2], "failed")
            result[m[1]] = "failed" if result.get(m[1]) == "failed" else kind
    return result


def run_all(tmp: Path, pkg: Path, args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """One pytest process per trainer, ``args.jobs`` at a time; each one's output in ``args.log_dir`` if given."""
    pending, running, results = list(args.trainers), {}, {}
    while pending or running:
        while pending and len(running) < args.jobs:
            mode = pending.pop(0)
            cmd, env = command(mode, tmp, pkg, args)
            log = (args.log_dir / f"{mode}.log").open("w") if args.log_dir else subprocess.DEVNULL
            running[mode] = (subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        for mode, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                if log is not subprocess.DEVNULL:
                    log.close()
                del running[mode]
                results[mode] = outcomes(tmp / f"{mode}.xml")
                counts = {k: sum(v == k for v in results[mode].values()) for k in ("passed", "failed", "skipped")}
                print(f"{mode:6s} " + " ".join(f"{n:4d} {k}" for k, n in counts.items()), flush=True)
        time.sleep(1)
    return {mode: results[mode] for mode in args.trainers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="+", default=["trl", "echo", "echo0"], choices=["trl", "echo", "echo0"])
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of the tests)")
    parser.add_argument("tests", nargs="*", help="CLASS::TEST of the file to run (default: the whole file)")
    parser.add_argument("--standins", type=Path, default=Path(tempfile.gettempdir()) / "echo_trl_trl_sft_standins")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per test")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per pytest process")
    parser.add_argument("--jobs", type=int, default=1, help="trainers run side by side (one pytest process each)")
    parser.add_argument("--log_dir", type=Path, help="write each trainer's pytest output to LOG_DIR/<trainer>.log")
    parser.add_argument("--json", action="store_true", help="last stdout line: the outcome of every test per trainer")
    parser.add_argument(
        "--from_logs",
        type=Path,
        help="run nothing: read the outcomes from the <trainer>.log files of an earlier --log_dir (a run stopped part "
        "way included) and compare on the tests every trainer finished",
    )
    args = parser.parse_args(argv)
    if args.from_logs:
        results = {m: outcomes_from_log(args.from_logs / f"{m}.log") for m in args.trainers}
        done = set.intersection(*(set(r) for r in results.values()))
        results = {m: {t: o for t, o in r.items() if t in done} for m, r in results.items()}
        print(f"from the logs in {args.from_logs}: {len(done)} tests finished by every trainer")
        for mode, r in results.items():
            counts = {k: sum(v == k for v in r.values()) for k in ("passed", "failed", "skipped")}
            print(f"{mode:6s} " + " ".join(f"{n:4d} {k}" for k, n in counts.items()))
    else:
        for name, error in build(args.standins).items():
            print(f"stand-in not built: {ORG}/{name}: {error}")
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            pkg = stage(Path(tmp), args.standins.resolve())
            results = run_all(Path(tmp), pkg, args)
    worse = 0
    if "trl" in results:
        for mode in (m for m in results if m != "trl"):
            lost = sorted(t for t, o in results["trl"].items() if o == "passed" and results[mode].get(t) != "passed")
            gained = sorted(t for t, o in results[mode].items() if o == "passed" and results["trl"].get(t) != "passed")
            worse += len(lost)
            print(f"{mode}: {len(lost)} tests pass with SFTTrainer but not here; {len(gained)} the other way")
            for t in lost:
                print(f"  lost: {t}")
            for t in gained:
                print(f"  gained: {t}")
    if args.json:
        print(json.dumps(results))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
