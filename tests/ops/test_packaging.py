"""The built wheel, installed into a fresh virtual environment outside the repository, works as a
user gets it: it ships the Avro schemas and py.typed, installs no top-level ``consumers``, and its
``streamsched --version``, ``emit`` and ``run`` work against the broker.

Before: the wheel had no schemas, so an installed ``streamsched emit`` failed ("Kafka is
unreachable (FileNotFoundError)"), and it installed the reference consumers as ``consumers``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from email.parser import Parser
from pathlib import Path

import pytest

from streamsched.ops.broker import free_port
from streamsched.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "streamsched", "schemas")
"""What a build needs: copied out first, so the build leaves nothing in the checkout."""

TINY_APP = '''
import os

from streamsched import App, CommandContext, Selection, Turn, external_command

app = App("tiny")


@external_command()
async def record(ctx: CommandContext, *, target: str) -> str:
    with open(os.environ["TINY_OUT"], "a") as out:
        out.write(target + "\\n")
    return ctx.idempotency_key


@app.scheduler(name=os.environ["TINY_NAME"], topic=os.environ["TINY_TOPIC"],
               selection=Selection("due", type="due"), commands=[record], claim_duration_s=5)
async def handle(turn: Turn) -> None:
    await turn.commands.record(target=turn.event.target[0])
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    # Verbose: the build backend's warnings are kept (build.log) for the metadata test.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(work / "dist"),
                           str(src)], timeout=180, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (work / "build.log").write_text(proc.stdout + proc.stderr)
    (built,) = (work / "dist").glob("streamsched-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (not the project's, no access to its packages) with the wheel installed."""
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    proc = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", str(wheel)],
                          timeout=300, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir / "bin"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything pointing back at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STREAMSCHED_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def test_the_wheel_ships_schemas_and_py_typed_but_not_the_reference_consumers(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(metadata).decode())
        entry_points = zf.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    schemas = {p.name for p in (ROOT / "schemas").glob("*.avsc")}
    assert len(schemas) >= 7
    prefix = "streamsched/_schemas/"
    packaged = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
    assert packaged == schemas
    assert "streamsched/py.typed" in names
    assert not [n for n in names if n.startswith("consumers/")]
    assert {n.split("/")[0] for n in names} <= {"streamsched", metadata.split("/")[0]}
    aiokafka = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("aiokafka")]
    assert len(aiokafka) == 1 and "==" not in aiokafka[0] and "<" in aiokafka[0], aiokafka
    assert all(c in aiokafka[0] for c in ("lz4", "snappy", "zstd"))  # compression support
    # Installed, the pytest plugin and the Faust codec register themselves (no conftest needed).
    sections = {line.strip("[]") for line in entry_points.splitlines() if line.startswith("[")}
    assert {"console_scripts", "pytest11", "faust.codecs"} <= sections
    assert "streamsched = streamsched.testing.plugin" in entry_points
    assert "streamsched = streamsched.integrations.faust:transition_codec" in entry_points


def test_the_license_is_an_spdx_expression_the_build_does_not_warn_about(wheel: Path) -> None:
    # A license table made setuptools print its deprecation notice, a boxed page, twice per
    # install (`make demo` on a fresh machine showed both).
    log = (wheel.parents[1] / "build.log").read_text()
    assert "Warning" not in log and "deprecated" not in log, log[-3000:]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(metadata).decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_installed_cli_emits_and_runs(venv: Path, bootstrap: str, tmp_path: Path,
                                          unique: Callable[[str], str]) -> None:
    cwd = tmp_path / "app"  # outside the repository
    cwd.mkdir()
    (cwd / "tinyapp.py").write_text(TINY_APP)
    topic, name, out = unique("pkg"), unique("pkg").replace("-", "_"), cwd / "out.txt"
    state_home = tmp_path / "state"  # `run` keeps claims on disk under $XDG_STATE_HOME by default
    env = clean_env(TINY_OUT=str(out), TINY_NAME=name, TINY_TOPIC=topic, XDG_STATE_HOME=str(state_home))
    streamsched = str(venv / "streamsched")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([streamsched, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120)

    # The package really is the installed one, and `consumers` is not importable there.
    where = subprocess.run([str(venv / "python"), "-c", "import streamsched; print(streamsched.__file__); "
                            "import importlib.util as u; print(u.find_spec('consumers'))"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and where.stdout.splitlines()[0].startswith(str(venv.parent)), where
    assert where.stdout.splitlines()[1] == "None"

    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("streamsched 0."), version

    topics_dir = cwd / "topics"
    topics_dir.mkdir()
    (topics_dir / "t.toml").write_text(f'[[topic]]\nname = "{topic}"\npartitions = 2\n')
    applied = cli("topics", "apply", "--dir", str(topics_dir), "--app", "tinyapp:app",
                  "--bootstrap", bootstrap)
    assert applied.returncode == 0, applied.stderr

    targets = [f"r{i}" for i in range(3)]
    for target in targets:
        event = json.dumps({"type": "due", "tenant": "t", "target": [target]})
        emitted = cli("emit", topic, "--event", event, "--bootstrap", bootstrap)
        assert emitted.returncode == 0, emitted.stderr  # the schemas are found in the wheel
        assert json.loads(emitted.stdout)["topic"] == topic

    port = free_port()
    worker = subprocess.Popen([streamsched, "run", "--app", "tinyapp:app", "--bootstrap", bootstrap,
                               "--status-port", str(port)], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        async def handled() -> bool:
            return out.exists() and sorted(out.read_text().split()) == targets

        asyncio.run(wait_for(handled, timeout=90, what="the installed worker to run every event"))
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = worker.wait(timeout=60)
        assert code == 0 and time.monotonic() - started < 30
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        stderr = worker.stderr.read() if worker.stderr else ""
    assert "Traceback" not in stderr, stderr
    stores = state_home / "streamsched" / "stores"
    assert sorted(p.name for p in stores.iterdir()) == [f"__streamsched.state.{name}"]  # one per topic
    assert sorted(p.name for p in (stores / f"__streamsched.state.{name}").iterdir()) == ["0", "1"]
