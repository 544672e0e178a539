"""Components a test needs from outside the project (a Python package, a program) and cannot find.

Locally a missing component skips the test, saying what to install. Under ``CI=true`` (``.ci/run``
sets it) it fails the test instead: a CI run that silently skipped the PostgreSQL outbox or the
Faust integration would pass while proving less than it says. Any other skip is audited by
tests/skip_audit.py: listed at the end of each run, and failing a CI run unless
tests/skips-allowed.txt names it.

Imported as ``components`` by tests in any folder below tests/ (pytest puts this folder on
``sys.path`` for the conftest.py beside it), like java_support.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

MARKER = "component"
"""``@pytest.mark.component(name, reason, found=...)``: see :func:`needs` (handled in conftest.py)."""


def under_ci() -> bool:
    """``CI`` is set to true (any of true/1/yes, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(name: str, reason: str) -> NoReturn:
    """The component ``name`` is missing: skip the calling test (or module, or fixture), or fail it
    under ``CI=true``. ``reason`` says what is missing and how to install it."""
    message = f"{name} missing: {reason}"
    if under_ci():
        pytest.fail(f"{message} (CI=true: a missing component fails the run instead of skipping)",
                    pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_module(module: str, reason: str) -> ModuleType:
    """``module`` imported, or :func:`require` (``pytest.importorskip`` that fails under CI)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        require(module, reason)


def find_program(name: str, dirs: Iterable[str | Path] = ()) -> str | None:
    """``name`` in the first of ``dirs`` that has it, else on PATH, else None."""
    for d in dirs:
        path = Path(d) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


def require_program(name: str, reason: str, dirs: Iterable[str | Path] = ()) -> str:
    """The path of program ``name`` (see :func:`find_program`), or :func:`require`."""
    path = find_program(name, dirs)
    if path is None:
        require(name, reason)
    return path


def needs(name: str, reason: str, *, found: bool) -> pytest.MarkDecorator:
    """A mark for a test (or ``pytestmark``) that needs ``name``: when not ``found``, the test is
    skipped locally and fails under ``CI=true`` (tests/conftest.py calls :func:`require` before
    it runs)."""
    return getattr(pytest.mark, MARKER)(name, reason, found=found)
