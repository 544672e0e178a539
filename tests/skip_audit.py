"""Every pytest run ends with its skipped tests and their reasons; under ``CI=true`` a skip that
the allow-list (tests/skips-allowed.txt) does not name fails the run.

A CI run that passes while it skipped the browser, the registry or the fault scenarios proves
less than it says. A missing component already fails its test under ``CI=true``
(tests/components.py); this catches every other skip, one a test makes itself included. What may
skip in CI is written down, each with its reason, in one file.

Allow-list lines: ``TEST | REASON | WHY``. ``TEST`` is a node id (``tests/x.py::test_y``) and
``REASON`` the skip's reason, each matched in full, ``*`` standing for any text; ``WHY`` says why
that skip is expected in a full CI run, and must not be empty. ``#`` starts a comment line.

Registered by tests/conftest.py for every run of the suite (``make test`` runs pytest three times:
the main suite, the fault matrix and the other Kafka line; each is checked); ``-p
tests.skip_audit`` loads it on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.components import under_ci

ALLOW_LIST = Path(__file__).with_name("skips-allowed.txt")
PLUGIN_NAME = "streamsched-skip-audit"


@dataclass(frozen=True)
class Allowed:
    """One allow-list entry: the tests and the reason it covers, and why."""

    test: str
    reason: str
    why: str

    def covers(self, test: str, reason: str) -> bool:
        return bool(_glob(self.test).fullmatch(test)) and bool(_glob(self.reason).fullmatch(reason))


def _glob(pattern: str) -> re.Pattern[str]:
    """``*`` is any text; everything else literal (node ids hold ``[``, reasons ``(``)."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.S)


def load(path: Path) -> list[Allowed]:
    """The entries of the allow-list at ``path``; a malformed line is a usage error naming it."""
    entries: list[Allowed] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise pytest.UsageError(f"{path}:{n}: expected `TEST | REASON | WHY`, each non-empty")
        entries.append(Allowed(*parts))
    return entries


@dataclass(frozen=True)
class Skip:
    test: str
    reason: str


class SkipAudit:
    """Collects the skips of a session; reports them; under ``enforce`` fails on unlisted ones."""

    def __init__(self, allowed: list[Allowed], *, enforce: bool, source: Path) -> None:
        self.allowed = allowed
        self.enforce = enforce
        self.source = source
        self.skips: list[Skip] = []

    def _record(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        self.skips.append(Skip(report.nodeid, reason.removeprefix("Skipped: ")))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)  # a module skipped as a whole (allow_module_level)

    def unlisted(self) -> list[Skip]:
        return [s for s in self.skips if not any(a.covers(s.test, s.reason) for a in self.allowed)]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.enforce and self.unlisted() and session.exitstatus in (pytest.ExitCode.OK,
                                                                         pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        if not self.skips and not self.enforce:
            return  # a CI log says "0 skipped"; a developer's run of one file need not
        unlisted = set(self.unlisted())
        tr.write_sep("-", f"{len(self.skips)} skipped")
        for reason, count in sorted(Counter(s.reason for s in self.skips).items()):
            tr.write_line(f"{count:>4} x {reason}")
        if not unlisted:
            return
        if self.enforce:
            tr.write_line(f"CI=true: {len(unlisted)} skip(s) not in {self.source}, failing the run:",
                          red=True)
        else:
            tr.write_line(f"not in {self.source} (a CI run would fail on these):")
        for skip in sorted(unlisted, key=lambda s: s.test):
            tr.write_line(f"  {skip.test}: {skip.reason}")


def register(config: pytest.Config, path: Path = ALLOW_LIST) -> None:
    """Audit this session's skips against the allow-list at ``path`` (enforced under ``CI=true``)."""
    if config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    audit = SkipAudit(load(path), enforce=under_ci(), source=path)
    config.pluginmanager.register(audit, PLUGIN_NAME)


def pytest_configure(config: pytest.Config) -> None:
    """Loaded on its own (``-p tests.skip_audit``)."""
    register(config)
