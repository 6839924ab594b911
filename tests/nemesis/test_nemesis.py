"""The nemesis in the suite: a short seeded run, and every seed that ever found a violation.

Each run is ``python -m tests.nemesis.runner`` in a subprocess (it starts its own private
PostgreSQL, workers and proxies), so its output — the seed, the history's path, the
verdict and the command that replays it — is the test's. The permanent seeds are in
``seeds.toml``: a seed that found a defect still open carries its defect and is expected
to fail (``xfail``, not strict: a replay repeats the faults, not the interleaving); once
the defect is fixed its mark goes and the seed stays, a regression test. The short run is
the seed marked ``short_run`` there.

Each run is an xdist group of its own, so that ``--dist loadgroup`` spreads the runs over
the workers (each run has its own server on a free port), and runs beside the rest of the
suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.nemesis]

SEEDS_FILE = Path(__file__).with_name("seeds.toml")
#: A seed whose run is longer than this, or marked ``by_hand``, is replayed only with
#: NEMESIS_LONG_SEEDS=1 (or by hand with ``make nemesis``): ``make test`` stays within minutes.
LONG_SEED_SECONDS = 300
SEEDS = tomllib.loads(SEEDS_FILE.read_text())["seed"]
#: The short run of ``make test``: every fault kind for 60 s at a tenth of the durations,
#: then the settling (bounded by the checker's 150 s), the start and the final read.
SHORT_RUN = next(entry for entry in SEEDS if entry.get("short_run"))


def run_nemesis(tmp_path: Path, *, seed: int, seconds: float, scale: float, **extra) -> None:
    args = [
        sys.executable,
        "-m",
        "tests.nemesis.runner",
        f"--seed={seed}",
        f"--seconds={seconds}",
        f"--scale={scale}",
        f"--out={tmp_path / 'run'}",
    ]
    if extra.get("kinds"):
        args.append(f"--kinds={extra['kinds']}")
    if extra.get("new_task"):
        args.append("--new-task")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = process.communicate(timeout=seconds + 420)
    except subprocess.TimeoutExpired:
        process.terminate()  # the runner stops its workers and its server on SIGTERM
        out, err = process.communicate(timeout=120)
        pytest.fail(f"the nemesis run did not end in time\n{out[-6000:]}{err[-3000:]}")
    # The tail holds the verdict, the forensics of a run that did not end quiet
    # (tests.nemesis.forensics) and the replay command.
    print(out[-20000:])
    assert process.returncode == 0, out[-20000:] + err[-3000:]


def permanent_seeds() -> list:
    params = []
    for index, entry in enumerate(SEEDS):
        if entry.get("short_run"):
            continue
        marks = [
            pytest.mark.timeout(entry["seconds"] + 900),
            pytest.mark.xdist_group(f"nemesis-{index}"),
        ]
        if entry.get("defect"):
            marks.append(pytest.mark.xfail(reason=f"known defect: {entry['defect']}"))
        if entry["seconds"] > LONG_SEED_SECONDS or entry.get("by_hand"):
            marks.append(
                pytest.mark.skipif(
                    not os.environ.get("NEMESIS_LONG_SEEDS"),
                    reason=f"a {entry['seconds']} s seed"
                    + (" replayed by hand" if entry.get("by_hand") else "")
                    + ": NEMESIS_LONG_SEEDS=1 replays it",
                )
            )
        params.append(pytest.param(entry, id=f"{index}-seed-{entry['seed']}", marks=marks))
    return params


def replay(tmp_path: Path, entry: dict) -> None:
    run_nemesis(
        tmp_path,
        seed=entry["seed"],
        seconds=entry["seconds"],
        scale=entry["scale"],
        kinds=entry.get("kinds", ""),
        new_task=entry.get("new_task", False),
    )


@pytest.mark.timeout(720)
@pytest.mark.xdist_group("nemesis-short")
def test_a_short_seeded_run_finds_no_violation(tmp_path):
    replay(tmp_path, SHORT_RUN)


@pytest.mark.parametrize("entry", permanent_seeds())
def test_a_seed_that_once_found_a_violation(tmp_path, entry):
    replay(tmp_path, entry)
