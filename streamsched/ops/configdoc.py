"""``docs/reference/configuration.md``, rendered from the declarations: every ``STREAMSCHED_*``
variable (:data:`streamsched.settings.VARIABLES`) and every key of the TOML connection file
(:data:`streamsched.ops.config.FILE_KEYS`). ``make config-doc`` writes it; a test fails when the
page and the code disagree, so the reference cannot drift from what the code reads."""

from __future__ import annotations

from streamsched import settings
from streamsched.ops.config import FILE_KEYS

PATH = "docs/reference/configuration.md"

_GROUPS = (
    ("connection", "Kafka connection",
     "Each is also a flag (`--bootstrap`, `--sasl-username`, ...) and a key of the `--config` file; "
     "the flag wins, then the variable, then the file."),
    ("worker", "Workers and tickers",
     "Read by `streamsched run` (and, for the group settings, by `schedule tick`)."),
    ("logging", "Logging", "Read by every command."),
    ("status", "Status server and console", ""),
    ("commands", "Other commands", ""),
)
_EXAMPLE = """\
bootstrap = "kafka-1:9093,kafka-2:9093"
security_protocol = "SASL_SSL"

[sasl]
mechanism = "SCRAM-SHA-512"
username = "pipelines"
password_file = "/run/secrets/kafka"

[ssl]
cafile = "ca.pem"

[client]
request_timeout_ms = 40000
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(var: settings.Variable) -> str:
    default = f"`{var.default}`" if var.default else "-"
    return f"| `{var.name}` | {var.kind} | {default} | {_cell(var.accepts())} | {_cell(var.description)} |\n"


def _table(variables: list[settings.Variable]) -> str:
    head = "| Variable | Type | Default | Accepts | Meaning |\n|---|---|---|---|---|\n"
    return head + "".join(_row(v) for v in variables)


def reference_markdown() -> str:
    """The whole page (``make config-doc`` writes it to :data:`PATH`)."""
    public = [v for v in settings.VARIABLES if not v.internal and v.alias_of is None]
    out = [
        "# Configuration reference\n\n",
        "Generated from `streamsched/settings.py` and `streamsched/ops/config.py` by "
        "`make config-doc`; do not edit by hand.\n\n",
        "Every command checks the `STREAMSCHED_*` variables it reads before it starts (the "
        "connection's, if it connects; the others as their description names the command): a bad "
        "value is one line on stderr naming the variable (never a secret's value) and exit code 2. "
        "A variable only other commands read is not looked at. An empty variable counts as unset. "
        "Variables with other names under the prefix are left alone (an app may use it).\n\n",
        "Durations have one syntax everywhere: `30s`, `5m`, `36h`, `7d`; a bare number is seconds. "
        "Choices such as log levels are accepted in any case. Booleans are `true`/`false`, "
        "`1`/`0`, `yes`/`no` or `on`/`off`.\n\n",
        "## Environment variables\n\n",
    ]
    for group, title, intro in _GROUPS:
        members = [v for v in public if v.group == group]
        out.append(f"### {title}\n\n" + (f"{intro}\n\n" if intro else "") + _table(members) + "\n")
    aliases = [v for v in settings.VARIABLES if v.alias_of is not None]
    out.append(f"### Deprecated\n\nStill read, with one warning on stderr; removed in {settings.REMOVED_IN}. "
               "When both are set, the new variable wins.\n\n"
               "| Variable | Replaced by | Unit |\n|---|---|---|\n")
    out += [f"| `{v.name}` | `{v.alias_of}` | {'milliseconds' if v.scale != 1 else 'seconds'} |\n"
            for v in aliases]
    internal = [v for v in settings.VARIABLES if v.internal]
    out.append("\n### Internal and testing\n\nFor the test suite, crash drills and the example apps; "
               "not for deployments.\n\n" + _table(internal) + "\n")
    out.append("## Connection file (`--config`)\n\n"
               "A TOML file named by `--config` or `STREAMSCHED_CONFIG`; relative paths in it are "
               "relative to the file. Unknown keys are refused (named, values never shown); a file "
               "that does not parse is reported with its line and column. For example:\n\n"
               "<!-- excerpt -->\n```toml\n" + _EXAMPLE + "```\n\n"
               "| Key | Default | Flag | Variable | Meaning |\n|---|---|---|---|---|\n")
    for k in FILE_KEYS:
        s = k.setting
        table = s is not None and s.kind == "options"
        key = f"[{k.key[0]}]" if table else ".".join(k.key)
        flag = f"`{s.flag}`" if s else "-"
        env = f"`{s.env}`" if s else "-"
        who = {"client": "every client", "admin": "admin clients only"}.get(k.key[0], f"{k.key[0]}s only")
        meaning = f"a table of aiokafka options for {who} (name = value)" if table else k.help
        out.append(f"| `{key}` | {_cell(k.default)} | {flag} | {env} | {_cell(meaning)} |\n")
    return "".join(out)
