"""The Java programs of the broker tests: single source files run with ``java File.java`` (no
compile step), on a classpath resolved by Maven or made of the broker's own jars.

Imported as ``java_support`` by tests in any folder below tests/ (pytest puts this folder on
``sys.path`` for the conftest.py beside it).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from components import needs

JAVA_HEAP = "-Xmx256m"
"""The machine is shared with the broker and other tests: a short-lived producer needs little."""


def requires(*tools: str) -> pytest.MarkDecorator:
    """Skip unless every one of ``tools`` (``java``, ``mvn``) is on PATH (fail under ``CI=true``:
    tests/components.py)."""
    missing = [t for t in tools if shutil.which(t) is None]
    return needs(" and ".join(missing or tools), f"needs {' and '.join(tools)} on PATH", found=not missing)


def maven_classpath(pom: Path, out_dir: Path, *, timeout: float = 110) -> str:
    """The dependencies of ``pom`` as a classpath (Maven caches them in ~/.m2 after the first run)."""
    target = out_dir / "cp.txt"
    subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:build-classpath",
                    f"-Dmdep.outputFile={target}"], check=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return target.read_text().strip()


def run_java(source: Path, classpath: str, args: Sequence[str], *, stdin: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the single-file program ``source`` with ``args``; its stdin is ``stdin`` (or nothing).

    Returns the finished process (text output captured) whatever its exit code: each test says
    what a failure shows.
    """
    cmd = ["java", JAVA_HEAP, "-cp", classpath, str(source), *args]
    if stdin is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
