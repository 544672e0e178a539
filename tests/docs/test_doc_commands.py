"""Every ``streamsched ...`` command line shown in README.md and docs/ (excerpts included) parses
with the real CLI, without a deprecation warning: a page cannot teach a flag the CLI does not have,
or an old spelling. The generated CLI reference is checked against the parser elsewhere."""

from __future__ import annotations

import re
import shlex

import pytest

from streamsched.ops import cli
from tests.docs.test_doc_examples import PAGES, ROOT, parse_page

# Lines of a shell block that start a streamsched command (after an optional prompt).
_COMMAND = re.compile(r"^\s*(?:\$\s+)?streamsched\s+(?P<rest>.*)$")
# Shell syntax that ends the streamsched command: a pipe, a list, a background job, a redirect.
_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}


def command_lines() -> list[tuple[str, list[str]]]:
    """(page:line, argv) for each streamsched command in a shell-ish fenced block."""
    found: list[tuple[str, list[str]]] = []
    for path in PAGES:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("docs/reference/"):
            continue  # generated from the parser itself
        for block in parse_page(path.read_text(), rel):
            if block.lang not in {"bash", "sh", "shell", "console", ""}:
                continue
            lines = block.text.replace("\\\n", " ").splitlines()
            for offset, line in enumerate(lines, start=1):
                m = _COMMAND.match(line)
                if m is None or "$(" in m["rest"] or "`" in m["rest"]:
                    continue
                try:
                    words = shlex.split(m["rest"], comments=True)
                except ValueError:
                    continue  # not a whole command line (prose in a text block)
                argv: list[str] = []
                for word in words:
                    if word in _END or word.startswith((">", "2>")):
                        break
                    argv.append(word)
                found.append((f"{block.page}:{block.line + offset}", argv))
    return found


COMMANDS = command_lines()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 40, len(COMMANDS)


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses_without_a_deprecation(where: str, argv: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    if argv[:1] in (["--version"], ["--help"], ["-h"]) or "--help" in argv or "-h" in argv:
        return
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as exc:
        err = capsys.readouterr().err.strip().splitlines()
        raise AssertionError(f"{where}: `streamsched {shlex.join(argv)}` does not parse: "
                             f"{err[-1] if err else exc.code}") from None
    err = capsys.readouterr().err
    assert "deprecated" not in err, f"{where}: `streamsched {shlex.join(argv)}`: {err.strip()}"
