"""The CLI reference (``docs/reference/cli.md``), generated from the parser itself: every command
and action with its usage, description, options (default, variable) and notes, then the exit
codes. ``make cli-doc`` writes it; a test fails when the page and the parser disagree."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

PAGE = Path("docs/reference/cli.md")
_WIDTH = "100"
_ENV = re.compile(r"\bSTREAMSCHED_[A-Z_]+\b")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, (*path, name))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = ""
    if action.nargs != 0:
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper())
        value = f" {metavar}"
    return ", ".join(f"`{o}{value}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if isinstance(action.default, list | tuple):
        return ""
    if action.default == "":
        return '`""`'
    return f"`{action.default}`"


_CONNECTION = "Kafka connection"


def _connection_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for g in parser._action_groups if g.title == _CONNECTION for a in g._group_actions]


def _options(parser: argparse.ArgumentParser, actions: list[argparse.Action] | None = None) -> list[str]:
    rows = ["| Option | Default | Environment | Description |", "|---|---|---|---|"]
    shared = set(_connection_actions(parser)) if actions is None else set()
    for action in parser._actions if actions is None else actions:
        if action in shared:
            continue
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        text = action.help or ""
        if action.required:
            text += " (required)"
        env = ", ".join(f"`{v}`" for v in dict.fromkeys(_ENV.findall(text)))
        rows.append(f"| {_flags(action)} | {_default(action)} | {env} | {_cell(text)} |")
    return rows if len(rows) > 2 else []


def _block(text: str) -> list[str]:
    return ["<!-- excerpt -->", "```text", *text.rstrip("\n").splitlines(), "```", ""]


def _exit_codes(text: str) -> list[str]:
    rows = ["| Code | Meaning |", "|---|---|"]
    entries: list[list[str]] = []
    tail: list[str] = []
    for line in text.splitlines()[1:]:
        m = re.match(r"^  (\S+)\s+(.*)$", line)
        if m and not line.startswith("         "):
            entries.append([m.group(1), m.group(2)])
        elif line.startswith("   ") and entries:
            entries[-1][1] += " " + line.strip()
        elif line.strip():
            tail.append(line.strip())
    rows += [f"| {code} | {_cell(meaning)} |" for code, meaning in entries]
    return [*rows, "", *([" ".join(tail), ""] if tail else [])]


def reference_markdown() -> str:
    """The whole page, from a parser built without any STREAMSCHED_* variable (so defaults are
    the code's, never this shell's) at a fixed width."""
    from streamsched.ops.cli.common import EXIT_CODES
    from streamsched.ops.cli.parser import build_parser

    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    with mock.patch.dict(os.environ, {**clean, "COLUMNS": _WIDTH}, clear=True):
        parser = build_parser()
        commands = list(_walk(parser))[1:]
        out = ["# CLI reference", "",
               "Generated from the parser (`streamsched.ops.cli.reference`); regenerate it with "
               "`make cli-doc`, never by hand. Each command's `--help` prints the same.", "",
               _cell(parser.description or ""), "",
               "Deprecated spellings (listed as `deprecated: use ...`) still work for one minor version "
               "and print `streamsched: warning: ... is deprecated, use ...` on stderr.", "",
               "## Commands", ""]
        for path, _ in commands:
            indent = "  " * (len(path) - 1)
            anchor = "streamsched-" + "-".join(path)
            out.append(f"{indent}- [`streamsched {' '.join(path)}`](#{anchor})")
        out.append("")
        connection_of: argparse.ArgumentParser = parser
        for path, sub in commands:
            out += [f"## streamsched {' '.join(path)}", ""]
            if sub.description:
                out += [_cell(sub.description), ""]
            out += _block(sub.format_usage())
            if _subcommands(sub):
                actions = ", ".join(f"`{name}`" for name in _subcommands(sub))
                out += [f"Actions: {actions}.", ""]
            options = _options(sub)
            if options:
                out += [*options, ""]
            if _connection_actions(sub):
                connection_of = sub
                out += ["And the [Kafka connection options](#kafka-connection-options).", ""]
            if sub.epilog:
                out += _block(sub.epilog)
        group = next(g for g in connection_of._action_groups if g.title == _CONNECTION)
        out += ["## Kafka connection options", "", f"Every command that talks to Kafka takes these: "
                f"{_cell(group.description or '')}.", "",
                *_options(connection_of, _connection_actions(connection_of)), ""]
        out += ["## Exit codes", "", *_exit_codes(EXIT_CODES)]
    return "\n".join(out).rstrip("\n") + "\n"


def write(root: Path = Path(".")) -> Path:
    """Write the page under ``root`` (``make cli-doc``)."""
    path = root / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reference_markdown())
    return path


if __name__ == "__main__":
    print(write())
