"""The CLI's grammar, shared by every command: the parser class (one-line usage errors, checks
across flags), the help formatter (shown defaults), the one deprecation mechanism for old
spellings, the duration type, and the flags several commands share (``--app``, ``--scheduler``,
``-o/--output``, the status server)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from streamsched.errors import ConfigError

Check = Callable[[argparse.Namespace], str | None]
"""A check across flags: the refusal (one line), or None."""

APP_HELP = "MODULE:ATTR of a streamsched.App"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's non-None default shown (unless its
    help already tells the default, as those that come from a variable do); old spellings
    listed in help (their own group), not in the usage line."""

    def add_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, [a for a in actions if not isinstance(a, Deprecated)], groups, prefix)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
                and (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``streamsched CMD: error: ...``, exit 2)
    and which runs its :data:`Check` functions once its own arguments are parsed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.checks: list[Check] = []

    def error(self, message: str) -> NoReturn:
        # Like every other failure: "streamsched: COMMAND: what is wrong", one line; the usage
        # block argparse would print buries it (``--help`` still shows the full usage).
        command = self.prog.removeprefix("streamsched").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"streamsched: {where}{message} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self.error(f"unrecognized arguments: {' '.join(extra)}")  # named by the command they miss
        for check in self.checks:
            refusal = check(parsed)
            if refusal:
                self.error(refusal)
        return parsed, extra


def warn(text: str) -> None:
    print(f"streamsched: warning: {text}", file=sys.stderr)


class Deprecated(argparse.Action):
    """An old spelling kept for one minor version: it warns on stderr (``streamsched: warning:
    X is deprecated, use Y``) and stores its value where the new spelling does (``target``),
    through ``convert`` if given. A switch (``nargs=0``) stores ``const``. Used for options and
    for optional positionals (absent, it never runs)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, target: str, use: str,
                 convert: Callable[[str], Any] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("default", argparse.SUPPRESS)
        kwargs.setdefault("help", f"deprecated: use {use}")
        super().__init__(option_strings, dest, **kwargs)
        self.target, self.use, self.convert = target, use, convert

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        old = option_string or f"the positional {self.metavar or self.dest.upper()}"
        warn(f"{old} is deprecated, use {self.use}")
        value = self.const if self.nargs == 0 else values
        if self.convert is not None:
            try:
                value = self.convert(value)
            except (ArgumentTypeError, ValueError) as exc:
                parser.error(f"argument {old}: {exc}")
        setattr(namespace, self.target, value)


ArgumentTypeError = argparse.ArgumentTypeError


DEPRECATED_GROUP = "deprecated spellings (still accepted, with a warning; removed in the next minor version)"


def deprecated(p: argparse.ArgumentParser, *names: str, target: str, use: str, **kwargs: Any) -> None:
    """``names`` (an old option, or an optional positional) kept as a :class:`Deprecated` spelling
    of ``use``, listed in the parser's help under :data:`DEPRECATED_GROUP`."""
    group = next((g for g in p._action_groups if g.title == DEPRECATED_GROUP), None)
    if group is None:
        group = p.add_argument_group(DEPRECATED_GROUP)
    if not names[0].startswith("-"):
        kwargs.setdefault("nargs", "?")
    group.add_argument(*names, action=Deprecated, target=target, use=use, **kwargs)


def deprecated_switch(p: argparse.ArgumentParser, flag: str, *, target: str, value: Any, use: str) -> None:
    """``flag`` (no value) kept as a deprecated spelling of ``use``, storing ``value`` in ``target``."""
    deprecated(p, flag, nargs=0, const=value, target=target, use=use)


def duration(text: str) -> float:
    """An argparse type: seconds from ``30s``, ``5m``, ``36h``, ``7d`` or a bare number (seconds)."""
    from streamsched.model.durations import parse_duration

    try:
        return parse_duration(text)
    except (ConfigError, ValueError) as exc:
        raise ArgumentTypeError(str(exc)) from None


def seconds(text: str) -> float:
    """The old ``*-s`` flags' type: a number of seconds."""
    try:
        return float(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, not {text!r}") from None


def int_in(name: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer within [low, high]. A default from the environment is a
    string argparse converts with it only when the flag is absent, so a bad variable is a usage
    error (exit 2) naming the variable, and commands that never read it are unaffected."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ArgumentTypeError(f"{name} must be an integer in {low}..{high}, not {text!r}")
        return value

    return convert


def _output_format(text: str) -> str:
    if text == "text":  # inspect's first spelling
        warn("-o text is deprecated, use -o table")
        return "table"
    return text


def add_output(p: Parser, *, default: str = "table", json_alias: str | None = "--json") -> None:
    """``-o/--output table|json`` (and ``json_alias``, the command's old spelling, deprecated)."""
    p.add_argument("-o", "--output", choices=("table", "json"), default=default, type=_output_format,
                   help="output format: table (for people) or json (for tools)")
    if json_alias == "--json":
        deprecated_switch(p, "--json", target="output", value="json", use="-o json")
    elif json_alias == "--format":
        deprecated(p, "--format", target="output", use="-o/--output", choices=("table", "json"),
                   metavar="{table,json}")


def add_app(p: Parser, *, required: bool = True, help: str = APP_HELP) -> None:
    p.add_argument("--app", required=required, default=None, metavar="MODULE:ATTR", help=help)


def add_scheduler(p: Parser, *, help: str = "scheduler name (optional if the app has one)") -> None:
    p.add_argument("--scheduler", default=None, metavar="NAME", help=help)


def add_status_options(p: argparse.ArgumentParser, *, port_from_env: bool) -> None:
    # Only `run` reads STREAMSCHED_STATUS_PORT: a worker and a ticker started from one
    # environment must not both try to bind it.
    env_port = os.environ.get("STREAMSCHED_STATUS_PORT") if port_from_env else None
    p.add_argument("--status-port", type=int_in("the status port (STREAMSCHED_STATUS_PORT)", 0, 65535),
                   default=env_port or None,
                   help="serve /status (JSON), /metrics (Prometheus), /healthz and /readyz on this port"
                        + (" (env STREAMSCHED_STATUS_PORT)" if port_from_env else "") + "; default: none")
    p.add_argument("--status-host", default=os.environ.get("STREAMSCHED_STATUS_HOST", "127.0.0.1"),
                   help="address the status server binds (env STREAMSCHED_STATUS_HOST; default 127.0.0.1, "
                        "0.0.0.0 in a container)")


def add_instance_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("--instance-id", default=None, metavar="NAME",
                   help="static group membership: this process's stable name in its groups, e.g. a "
                        "StatefulSet pod's name (env STREAMSCHED_INSTANCE_ID; default: dynamic). Restarted "
                        "within the session timeout it gets its partitions back without a rebalance; "
                        "stopped, its partitions wait for it up to the session timeout")


def add_single_replica_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-single-replica", action="store_true",
                   help="allow creating internal topics with replication factor 1 on a multi-broker cluster "
                        "(default: refused; their records would be lost with one broker)")


def add_connection(p: argparse.ArgumentParser) -> None:
    from streamsched.ops.config import add_connection_options

    add_connection_options(p)


def family(sub: Any, name: str, help: str, **kwargs: Any) -> Any:
    """A command with actions (``schedule add``, ``dlq list``...): its parser's subparsers."""
    p = sub.add_parser(name, help=help, description=kwargs.pop("description", help[:1].upper() + help[1:]),
                       **kwargs)
    return p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser)


def command(sub: Any, name: str, help: str, fn: Callable[[argparse.Namespace], int], *,
            description: str | None = None, **kwargs: Any) -> Parser:
    """One (sub)command: its own usage, description and help; ``fn`` runs it."""
    p: Parser = sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:],
                               **kwargs)
    p.set_defaults(fn=fn)
    return p
