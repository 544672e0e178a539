"""The TestApp example (examples/billing.py and its tests, shown in docs/testing.md) runs as a
user runs it: ``python -m pytest examples/test_billing.py``, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_example_user_tests_pass() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "examples/test_billing.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


def test_the_example_in_the_docs_is_the_file_in_examples() -> None:
    doc = (ROOT / "docs" / "testing.md").read_text()
    for name in ("examples/billing.py", "examples/test_billing.py"):
        assert name in doc
    # The doc quotes the example's first test verbatim, so it cannot drift from what runs.
    tests = (ROOT / "examples" / "test_billing.py").read_text()
    start = tests.index("def test_a_due_invoice_is_charged_once")
    quoted = tests[start:tests.index("\n\n\n", start)]
    assert quoted in doc
