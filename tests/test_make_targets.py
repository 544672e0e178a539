"""The Makefile's setup targets: `make demo` installs only what it runs, and a target that cannot
install a test tool fails under ``CI=true`` (on a developer's machine it says so, and the tests
that need the tool skip)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def dry_run(*targets: str) -> str:
    """What ``make -n -B TARGETS`` would run: every recipe of the targets and their prerequisites,
    none executed."""
    return subprocess.run(["make", "--no-print-directory", "-n", "-B", "-C", str(ROOT), *targets],
                          capture_output=True, text=True, timeout=60, check=True).stdout


def test_the_demo_installs_the_package_without_the_dev_extra() -> None:
    demo = dry_run("demo")
    assert "pip install -q -e .\n" in demo and "scripts/demo.py" in demo
    assert "[dev]" not in demo  # the docs site, the browser driver, Faust, mypy... are the suite's
    assert "pip install -q -e '.[dev]'" in dry_run("test-unit")  # the suite keeps its extra


@pytest.mark.parametrize("target", ["promtool", "chromium", "postgres", "fault-tools"])
def test_a_tool_target_that_cannot_install_fails_only_under_ci(target: str, tmp_path: Path) -> None:
    # A PATH with neither the tool nor apt-get: the target cannot install it.
    for tool in ("id", "tr"):
        (tmp_path / tool).symlink_to(f"/usr/bin/{tool}")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "STREAMSCHED_PG_BIN")}
    env.update(PATH=str(tmp_path), PG_BIN=str(tmp_path / "no-postgres"))

    def make(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/usr/bin/make", "--no-print-directory", "-C", str(ROOT), target],
                              env={**env, **extra}, capture_output=True, text=True, timeout=60)

    local = make()
    assert local.returncode == 0 and "not installable here" in local.stdout, local
    ci = make(CI="true")
    assert ci.returncode != 0 and "not installable here" in ci.stdout, ci
    assert "CI=true: a tool the tests need is missing, failing" in ci.stderr
