"""A CI run is as strict by hand as on a CI service: ``.ci/run`` sets ``CI=true``, and each pytest
run ends with its skips and their reasons, failing under ``CI=true`` on a skip
tests/skips-allowed.txt does not list (tests/skip_audit.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import skip_audit

pytest_plugins = ("pytester",)
ROOT = Path(__file__).resolve().parent.parent

SUITE = '''
import pytest

def test_passes():
    pass

def test_listed():
    pytest.skip("needs Kafka 4.x (this run: 3.9)")

@pytest.mark.parametrize("n", [1, 2])
def test_unlisted(n):
    pytest.skip("no frobnicator on PATH")
'''
SKIPPED_MODULE = '''
import pytest

pytest.skip("a whole module without its tool", allow_module_level=True)
'''
CONFTEST = '''
from pathlib import Path

from tests import skip_audit


def pytest_configure(config):
    skip_audit.register(config, Path(__file__).with_name("allowed.txt"))
'''
LISTED = "test_suite.py::test_listed | needs Kafka 4.x * | the other line runs it\n"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the inner run imports tests.skip_audit
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    pytester.path.joinpath("allowed.txt").write_text("# what may skip\n\n" + LISTED)
    return pytester


def _run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess("-q", "-p", "no:cacheprovider", *args, timeout=120)


def test_a_run_ends_with_its_skips_and_their_reasons(project: pytest.Pytester) -> None:
    result = _run(project)
    assert result.ret == pytest.ExitCode.OK  # not under CI: reported, never failed
    result.stdout.fnmatch_lines(["*- 3 skipped -*", "   1 x needs Kafka 4.x (this run: 3.9)",
                                 "   2 x no frobnicator on PATH",
                                 "not in *allowed.txt (a CI run would fail on these):",
                                 "  test_suite.py::test_unlisted?1?: no frobnicator on PATH",
                                 "  test_suite.py::test_unlisted?2?: no frobnicator on PATH"])


def test_under_ci_an_unlisted_skip_fails_the_run(project: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = _run(project)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["CI=true: 2 skip(s) not in *allowed.txt, failing the run:",
                                 "  test_suite.py::test_unlisted?1?: no frobnicator on PATH"])
    result.stdout.no_fnmatch_line("*test_listed: needs*")  # the listed one is allowed
    # Listed (brackets in a node id are literal, * any text), the run passes.
    project.path.joinpath("allowed.txt").write_text(
        LISTED + "test_suite.py::test_unlisted[*] | no frobnicator on PATH | none on this machine\n")
    assert _run(project).ret == pytest.ExitCode.OK


def test_under_ci_a_module_skipped_whole_counts_too(project: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    project.makepyfile(test_module=SKIPPED_MODULE)
    result = _run(project, "test_module.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*- 1 skipped -*", "  test_module.py: a whole module without its tool"])


def test_an_entry_without_its_reason_is_a_usage_error(project: pytest.Pytester) -> None:
    project.path.joinpath("allowed.txt").write_text("test_suite.py::test_listed | needs Kafka 4.x *\n")
    result = _run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*allowed.txt:1: expected `TEST | REASON | WHY`, each non-empty*"])


def test_the_allow_list_of_the_suite_parses() -> None:
    for entry in skip_audit.load(skip_audit.ALLOW_LIST):
        assert entry.why.strip(), entry


def test_ci_run_sets_ci_true_itself(tmp_path: Path) -> None:
    # A stand-in make records what `.ci/run` runs it with.
    (tmp_path / "make").write_text('#!/bin/sh\necho "CI=$CI $*"\n')
    (tmp_path / "make").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    out = subprocess.run([str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout == "CI=true test\n"
