"""docs/runbook.md stays true: the alerts it names exist in the rules, every ``streamsched``
command line in it parses with the CLI as it is, and the tests it cites exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from streamsched.ops.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = (ROOT / "docs" / "runbook.md").read_text()


def _commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", RUNBOOK, re.S)
    inline = re.findall(r"`(streamsched [^`]+)`", RUNBOOK)
    lines = [line for block in blocks for line in block.splitlines() if line.startswith("streamsched ")]
    return [shlex.split(line)[1:] for line in [*lines, *inline]]


def test_every_alert_the_runbook_names_is_a_rule() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "streamsched-alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    named = set(re.findall(r"`(Streamsched[A-Za-z]+)`", RUNBOOK))
    assert named and named <= alerts, named - alerts


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a[:2]))
def test_every_command_in_the_runbook_parses(argv: list[str]) -> None:
    parser = build_parser()
    if argv and argv[0] == "status":
        argv = [a.replace("WORKER", "127.0.0.1") for a in argv]
    args = parser.parse_args(argv)  # exits (SystemExit) on an unknown flag or a missing value
    assert callable(args.fn)


def test_every_test_the_runbook_cites_exists() -> None:
    cited = set(re.findall(r"`(tests/[\w/]+\.py)`", RUNBOOK))
    missing = [p for p in cited if not (ROOT / p).exists()]
    assert cited and not missing, missing
