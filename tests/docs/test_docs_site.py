"""The documentation site builds strictly: every page in the nav exists, every link and anchor
between pages resolves, and every file a page includes (``--8<--``) is there. mkdocs' --strict
turns its warnings into a failed build; the test also fails on a warning line in its output, so
a warning that --strict does not count (a plugin's own) cannot slip through either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_without_warnings(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site),
         "--config-file", str(ROOT / "mkdocs.yml")],
        # The variable only silences material's end-of-life banner, which is not about the docs.
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert warnings == [], "\n".join(warnings)
    assert (site / "index.html").is_file()
    assert (site / "changelog" / "index.html").is_file()
