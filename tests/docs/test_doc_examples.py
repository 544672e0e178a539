"""Every code block of README.md and docs/**/*.md runs as a reader would copy it.

The convention, an HTML comment on the line directly above a fence:

* ``<!-- excerpt -->``: the block is not run (a fragment, or a command that needs what the page
  does not set up: an installer, a second broker, a production cluster).
* ``<!-- file: NAME -->``: the block's text is written to NAME (relative, subdirectories allowed)
  in the page's scratch directory when the walk reaches it, before later blocks run.

Unmarked blocks run, in page order, in a fresh scratch directory per page (the current
directory), with PATH starting with this Python's ``bin``, PYTHONPATH this checkout and
STREAMSCHED_BOOTSTRAP the test broker:

* ``python``: in one interpreter per page (one namespace; the scratch directory on sys.path),
  with the environment and directory the page's shell blocks left;
* ``bash``, ``sh``, ``shell``: in one bash per page, as typed into one terminal: variables,
  ``cd`` and jobs carry over from block to block; a leading ``$ `` is stripped. The first
  command that fails (as ``set -e`` sees it: not in an ``if``, ``while`` or ``&&``/``||``
  list) fails the page with its line and stderr. A command ending in ``&`` runs in the
  background; whatever is still running at the page's end gets SIGTERM (then SIGKILL);
* ``console``: the same for its ``$ `` lines (a trailing ``\\`` continues a command on the next
  line, a leading ``> `` there is dropped); every other line is expected output of the command
  above it: each such line must match one line of what it printed, in order, where ``...``
  matches anything and any run of spaces matches any run of spaces;
* any other language (toml, json, yaml, text, none, ...): must be marked, else the page fails
  naming page:line.

A page polls for effects that take a moment itself, readably (``for i in $(seq 30); do ...;
sleep 1; done``); the harness never sleeps. STREAMSCHED_DOCS_BLOCK_TIMEOUT (seconds, default 120)
bounds each block. A failure names page:line, the command and its stderr; the page's bash and
Python logs and each block's script stay in the test's tmp_path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

PYTHON = frozenset({"python", "py", "python3"})
SHELL = frozenset({"bash", "sh", "shell"})
CONSOLE = frozenset({"console"})
RUNNABLE = PYTHON | SHELL | CONSOLE

BLOCK_TIMEOUT_S = float(os.environ.get("STREAMSCHED_DOCS_BLOCK_TIMEOUT", "120"))
"""The longest one block may run (its own polling loops included)."""
STOP_TIMEOUT_S = 30.0
"""How long background jobs get to exit after SIGTERM at the page's end (a worker drains first)."""

README_MAX_LINES = 200


# --- the extractor ----------------------------------------------------------------------------------

class DocError(Exception):
    """A page the walker cannot read as the convention says (message: page:line: what)."""


@dataclass(frozen=True)
class Block:
    page: str
    """The page's path relative to the checkout (README.md, docs/quickstart.md)."""
    line: int
    """Line of the opening fence (1-based); the block's first line is ``line + 1``."""
    lang: str
    """The fence's language, lower case ("" when it has none)."""
    text: str
    mark: str | None = None
    """"excerpt", "file" or None (unmarked)."""
    file: str | None = None
    """The NAME of ``<!-- file: NAME -->``."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.mark is None and self.lang in RUNNABLE


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
_FILE_MARK = re.compile(r"^file:\s*(?P<name>[^\s]+)$")


def parse_page(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the marker directly above it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"].expandtabs())
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            raise DocError(f"{page}:{i + 1}: this code block is never closed")
        body = [_dedent(line, indent) for line in lines[i + 1:end]]
        mark, name = _marker(lines[i - 1] if i else "", page, i)
        lang = (opening["info"].split() or [""])[0].lower()
        blocks.append(Block(page, i + 1, lang, "".join(f"{b}\n" for b in body), mark, name))
        i = end + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    expanded = line.expandtabs()
    strip = min(indent, len(expanded) - len(expanded.lstrip(" ")))
    return expanded[strip:]


def _marker(above: str, page: str, index: int) -> tuple[str | None, str | None]:
    comment = _COMMENT.match(above)
    if comment is None:
        return None, None
    body = comment["body"]
    if body == "excerpt":
        return "excerpt", None
    named = _FILE_MARK.match(body)
    if named is not None:
        name = named["name"]
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise DocError(f"{page}:{index}: <!-- file: {name} --> must name a path inside the page's "
                           "scratch directory (relative, no ..)")
        return "file", name
    if re.match(r"(excerpt|file)\b", body):
        raise DocError(f"{page}:{index}: malformed marker <!-- {body} -->: use <!-- excerpt --> or "
                       "<!-- file: NAME -->")
    return None, None  # another comment: not a marker


def unmarked_problems(blocks: list[Block]) -> list[str]:
    """page:line of every block that neither runs nor is marked."""
    return [f"{b.where}: a ```{b.lang or '(no language)'} block is neither run nor marked: mark it "
            "<!-- file: NAME --> (written to the scratch directory) or <!-- excerpt --> (not run) "
            "on the line directly above the fence"
            for b in blocks if b.mark is None and b.lang not in RUNNABLE]


@dataclass(frozen=True)
class Command:
    line: int
    """Page line of the command's first line."""
    text: str
    expected: tuple[str, ...] = ()


def console_commands(block: Block) -> list[Command]:
    """A console block's ``$ `` commands, each with the output lines shown below it."""
    commands: list[Command] = []
    lines = block.text.splitlines()
    first = block.line + 1
    k = 0
    while k < len(lines):
        line = lines[k]
        if not (line.startswith("$ ") or line.rstrip() == "$"):
            if commands and line.strip():
                last = commands[-1]
                commands[-1] = Command(last.line, last.text, (*last.expected, line.rstrip()))
            elif line.strip():
                raise DocError(f"{block.page}:{first + k}: output before any `$ ` command in a console "
                               "block")
            k += 1
            continue
        start, text = k, [line[2:]]
        while text[-1].endswith("\\") and k + 1 < len(lines):
            k += 1
            text.append(lines[k].removeprefix("> "))
        commands.append(Command(first + start, "\n".join(text)))
        k += 1
    return commands


def output_matches(expected: tuple[str, ...], printed: str) -> bool:
    """Each expected line matches one printed line, in order (``...``: anything)."""
    actual = iter(printed.splitlines())
    for want in expected:
        pattern = re.compile(r"\s+".join(
            ".*".join(re.escape(part) for part in chunk.split("...")) for chunk in want.split()))
        if not any(pattern.fullmatch(got.strip()) for got in actual):
            return False
    return True


# --- the runner ---------------------------------------------------------------------------------

class PageFailed(Exception):
    pass


_DRIVER = r'''
import json, linecache, os, sys, traceback
messages = os.fdopen(os.dup(0), "r")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
results = os.fdopen(int(sys.argv[1]), "w")
namespace = {"__name__": "__main__"}
for raw in messages:
    msg = json.loads(raw)
    os.environ.clear()
    os.environ.update(msg["env"])
    os.chdir(msg["cwd"])
    if msg["cwd"] not in sys.path:
        sys.path.insert(0, msg["cwd"])
    source = "\n" * msg["line"] + msg["code"]
    linecache.cache[msg["page"]] = (len(source), None, source.splitlines(True), msg["page"])
    try:
        exec(compile(source, msg["page"], "exec"), namespace)
        result = {"ok": True}
    except SystemExit as exc:
        result = {"ok": exc.code in (0, None), "error": f"SystemExit: {exc.code}"}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.flush()
    sys.stderr.flush()
    results.write(json.dumps(result) + "\n")
    results.flush()
'''

_SHELL_PRELUDE = r'''
trap '__docs_st=$? __docs_line=$LINENO
if [ -n "${__docs_block:-}" ]; then
  __docs_block=
  printf "failed %s %s %s\n" "$__docs_line" "$__docs_st" "${BASH_COMMAND//$'"'\n'"'/ }" >&{ctl}
  return $__docs_st
fi' ERR
'''
"""The first failing command of a block (``set -e``'s rules) reports its line, status and text on
the control pipe and ends the block (``return`` from the ``source`` that runs it)."""


class _Lines:
    """Lines from a pipe, each awaited until a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def read(self, timeout: float) -> str | None:
        """The next line, "" at end of file, None when the timeout passes first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


class PageRun:
    """One page's scratch directory, its bash and its Python, and the jobs they leave running."""

    def __init__(self, page: str, work: Path, env: dict[str, str]) -> None:
        self.page, self.work = page, work
        self.scratch = work / "scratch"
        self.scratch.mkdir(parents=True)
        self.env, self.cwd = dict(env), str(self.scratch)
        self.bash: subprocess.Popen[bytes] | None = None
        self.python: subprocess.Popen[bytes] | None = None
        self.stuck = False
        """A block did not finish: its process is killed at once, not asked to stop."""
        self._files: list[IO[bytes]] = []
        self._shown: dict[str, int] = {}

    # -- blocks

    def run(self, block: Block) -> None:
        if block.mark == "excerpt":
            return
        if block.mark == "file":
            assert block.file is not None
            target = self.scratch / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.lang in PYTHON:
            self._run_python(block)
        elif block.lang in SHELL | CONSOLE:
            self._run_shell(block)

    def _log(self, name: str) -> IO[bytes]:
        f = open(self.work / name, "ab")  # noqa: SIM115 -- closed in close()
        self._files.append(f)
        return f

    def _tail(self, name: str, start: int = 0, limit: int = 4000) -> str:
        """The end of a log from ``start``; what a failure message shows is not shown again."""
        path = self.work / name
        if not path.exists():
            return ""
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
        self._shown[name] = max(self._shown.get(name, 0), start + len(data))
        return data.decode(errors="replace")[-limit:]

    def _size(self, name: str) -> int:
        path = self.work / name
        return path.stat().st_size if path.exists() else 0

    def _run_python(self, block: Block) -> None:
        if self.python is None:
            r, w = os.pipe()
            self.python = subprocess.Popen(
                [sys.executable, "-c", _DRIVER, str(w)], stdin=subprocess.PIPE,
                stdout=self._log("python.out"), stderr=self._log("python.err"),
                cwd=self.cwd, env=self.env, pass_fds=(w,), start_new_session=True)
            os.close(w)
            self._py_results = _Lines(r)
        assert self.python.stdin is not None
        err_at = self._size("python.err")
        message = {"code": block.text, "line": block.line, "page": block.page, "env": self.env,
                   "cwd": self.cwd}
        self.python.stdin.write((json.dumps(message) + "\n").encode())
        self.python.stdin.flush()
        answer = self._py_results.read(BLOCK_TIMEOUT_S)
        if not answer:
            self.stuck = True
            why = f"did not finish within {BLOCK_TIMEOUT_S:.0f} s" if answer is None else "ended Python"
            raise PageFailed(f"{block.where}: this python block {why}\nstderr:\n"
                             f"{self._tail('python.err', err_at)}")
        result = json.loads(answer)
        if not result["ok"]:
            raise PageFailed(f"{block.where}: this python block failed:\n{result['error']}")

    def _start_bash(self) -> None:
        r, w = os.pipe()
        self.bash = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-s"], stdin=subprocess.PIPE,
            stdout=self._log("shell.out"), stderr=self._log("shell.err"),
            cwd=self.cwd, env=self.env, pass_fds=(w,), start_new_session=True)
        os.close(w)
        self._ctl_fd, self._ctl = w, _Lines(r)
        self._send(_SHELL_PRELUDE.replace("{ctl}", str(w)))

    def _send(self, text: str) -> None:
        assert self.bash is not None and self.bash.stdin is not None
        try:
            self.bash.stdin.write(text.encode())
            self.bash.stdin.flush()
        except BrokenPipeError:
            pass  # bash has exited: the read of its answer says so

    def _run_shell(self, block: Block) -> None:
        if self.bash is None:
            self._start_bash()
        console = block.lang in CONSOLE
        commands = console_commands(block) if console else []
        script = self._console_script(block, commands) if console else _strip_prompts(block.text)
        path = self.work / f"block-{block.line}.sh"
        path.write_text(script)
        out_at, err_at = self._size("shell.out"), self._size("shell.err")
        env_file, pwd_file = self.work / "env", self.work / "pwd"
        self._send(f"__docs_block=1; source {shlex.quote(str(path))} </dev/null; __docs_st=$?; "
                   f"__docs_block=; env -0 > {shlex.quote(str(env_file))}; "
                   f"pwd > {shlex.quote(str(pwd_file))}; printf 'done %s\\n' $__docs_st >&{self._ctl_fd}\n")
        assert self.bash is not None
        failed: str | None = None
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            # In steps of a second: a shell that exited while its jobs hold the pipe says so.
            answer = self._ctl.read(min(1.0, max(0.0, deadline - time.monotonic())))
            ended = answer == "" or (answer is None and self.bash.poll() is not None)
            if ended or (answer is None and time.monotonic() >= deadline):
                self.stuck = True
                why = "ended the shell (exit?)" if ended else f"did not finish within {BLOCK_TIMEOUT_S:.0f} s"
                raise PageFailed(f"{block.where}: this {block.lang} block {why}\n"
                                 f"stdout:\n{self._tail('shell.out', out_at)}\n"
                                 f"stderr:\n{self._tail('shell.err', err_at)}")
            if answer is None:
                continue
            if answer.startswith("failed "):
                failed = answer
            elif answer.startswith("done "):
                break
        self.env = dict(kv.split("=", 1) for kv in env_file.read_text().split("\0") if "=" in kv)
        self.cwd = pwd_file.read_text().strip()
        if failed is not None:
            _, lineno, status, command = failed.split(" ", 3)
            raise PageFailed(f"{block.page}:{block.line + int(lineno)}: `{command}` failed (exit {status})\n"
                             f"stderr:\n{self._tail('shell.err', err_at)}")
        if console:
            self._check_console(block, commands, self._tail("shell.out", out_at, limit=1 << 20))

    @staticmethod
    def _console_script(block: Block, commands: list[Command]) -> str:
        """The console block as a script of the same lines: output lines blank, each command
        preceded (on its own line) by a marker in stdout that the output is split at."""
        lines = [""] * len(block.text.splitlines())
        for n, c in enumerate(commands):
            k = c.line - block.line - 1
            for extra, text in enumerate(c.text.split("\n")):
                lines[k + extra] = (f"printf '\\036{n}\\n'; " if extra == 0 else "") + text
        return "".join(f"{line}\n" for line in lines)

    @staticmethod
    def _check_console(block: Block, commands: list[Command], out: str) -> None:
        printed: dict[int, str] = {}
        parts = re.split(r"\x1e(\d+)\n", out)
        for n, text in zip(parts[1::2], parts[2::2], strict=True):
            printed[int(n)] = text
        for n, c in enumerate(commands):
            if c.expected and not output_matches(c.expected, printed.get(n, "")):
                shown = "\n".join(f"  {line}" for line in printed.get(n, "").splitlines()) or "  (nothing)"
                want = "\n".join(f"  {line}" for line in c.expected)
                raise PageFailed(f"{block.page}:{c.line}: `{c.text}` printed:\n{shown}\nexpected, in order "
                                 f"(`...` matches anything):\n{want}")

    # -- the end

    def close(self) -> str:
        """Stop the page's jobs and processes; what their logs say, for a failure message."""
        if self.bash is not None:
            if self.bash.poll() is None and not self.stuck:
                # bash stops its own jobs and reaps them; then it exits.
                self._send("__docs_block=; trap - ERR; kill $(jobs -p) 2>/dev/null; wait; exit 0\n")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.bash.wait(STOP_TIMEOUT_S)
            _kill_group(self.bash)
            os.close(self._ctl.fd)
        if self.python is not None:
            assert self.python.stdin is not None
            self.python.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.python.wait(0 if self.stuck else STOP_TIMEOUT_S)
            _kill_group(self.python)
            os.close(self._py_results.fd)
        for f in self._files:
            f.close()
        later = {name: self._tail(name, self._shown.get(name, 0), limit=2000)
                 for name in ("shell.err", "python.err") if name in self._shown}
        return "\n".join(f"--- {name}, after that:\n{text}" for name, text in later.items() if text.strip())


def _strip_prompts(text: str) -> str:
    return "".join(f"{line[2:] if line.startswith('$ ') else line}\n" for line in text.splitlines())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the process group (jobs a page left running, their children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()


def page_env(bootstrap: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # What a reader's shell would not have: the test harness's own settings, a connection file.
    for name in ("STREAMSCHED_CONFIG", "STREAMSCHED_TEST_BOOTSTRAP", "STREAMSCHED_DOCS_BLOCK_TIMEOUT"):
        env.pop(name, None)
    if bootstrap:
        env["STREAMSCHED_BOOTSTRAP"] = bootstrap
    return env


def run_page(page: str, blocks: list[Block], work: Path, env: dict[str, str]) -> None:
    run = PageRun(page, work, env)
    failure: PageFailed | None = None
    try:
        for block in blocks:
            run.run(block)
    except PageFailed as exc:
        failure = exc
    finally:
        logs = run.close()
    if failure is not None:
        raise PageFailed(f"{failure}\n{logs}".rstrip())


# --- the tests ------------------------------------------------------------------------------------

def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _page_params() -> Iterator[object]:
    for path in PAGES:
        try:
            runnable = any(b.runs for b in parse_page(path.read_text(), _rel(path)))
        except DocError:
            runnable = False
        yield pytest.param(path, id=_rel(path), marks=[pytest.mark.kafka] if runnable else [])


@pytest.mark.parametrize("path", list(_page_params()))
def test_page(path: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    page = _rel(path)
    try:
        blocks = parse_page(path.read_text(), page)
    except DocError as exc:
        blocks, problems = [], [str(exc)]
    else:
        problems = unmarked_problems(blocks)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if not any(b.runs for b in blocks):
        return
    bootstrap = request.getfixturevalue("bootstrap")
    failure = None
    try:
        run_page(page, blocks, tmp_path, page_env(bootstrap))
    except PageFailed as exc:
        failure = str(exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail into docs/")


def test_readme_quickstart_is_the_quickstart_page() -> None:
    """README's copy of the quickstart is docs/quickstart.md's, block for block (both run)."""

    def steps(path: Path) -> list[tuple[str, str | None, str | None, str]]:
        return [(b.lang, b.mark, b.file, b.text) for b in parse_page(path.read_text(), _rel(path))
                if b.mark == "file" or b.runs]

    readme, page = steps(ROOT / "README.md"), steps(ROOT / "docs" / "quickstart.md")
    assert page and readme == page


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local
    missing = sorted({t for t in local if not (ROOT / t).exists()})
    assert missing == [], f"README.md links to files that do not exist: {missing}"


# --- the walker itself (no Kafka) ---------------------------------------------------------------

SAMPLE = """\
# A page

<!-- excerpt -->
```bash
streamsched broker start
```

<!-- file: conf/app.toml -->
```toml
name = "x"
```

<!-- a comment, not a marker -->
```python
print("runs")
```

1. In a list:

   ```console
   $ echo one \\
   > two
   one two
   $ true
   ```

~~~
unlabeled
~~~
"""


def test_the_extractor_reads_markers_languages_and_lines() -> None:
    blocks = parse_page(SAMPLE, "docs/x.md")
    assert [(b.line, b.lang, b.mark, b.file, b.runs) for b in blocks] == [
        (4, "bash", "excerpt", None, False),
        (9, "toml", "file", "conf/app.toml", False),
        (14, "python", None, None, True),
        (20, "console", None, None, True),
        (27, "", None, None, False),
    ]
    assert blocks[1].text == 'name = "x"\n'
    assert blocks[3].text.startswith("$ echo one \\\n> two\n")  # the list's indentation removed
    assert console_commands(blocks[3]) == [Command(21, "echo one \\\ntwo", ("one two",)), Command(24, "true")]
    assert unmarked_problems(blocks) == [
        "docs/x.md:27: a ```(no language) block is neither run nor marked: mark it <!-- file: NAME --> "
        "(written to the scratch directory) or <!-- excerpt --> (not run) on the line directly above "
        "the fence"]


@pytest.mark.parametrize(("text", "message"), [
    ("```bash\necho\n", "x.md:1: this code block is never closed"),
    ("<!-- exerpt -->\n```toml\n```\n", None),  # not a marker: then the block is unmarked
    ("<!-- excerpt: why -->\n```toml\n```\n", "x.md:1: malformed marker <!-- excerpt: why -->"),
    ("<!-- file: ../up.toml -->\n```toml\n```\n", "x.md:1: <!-- file: ../up.toml --> must name a path"),
    ("<!-- file: /etc/x -->\n```toml\n```\n", "x.md:1: <!-- file: /etc/x --> must name a path"),
])
def test_the_extractor_refuses_what_it_cannot_follow(text: str, message: str | None) -> None:
    if message is None:
        assert unmarked_problems(parse_page(text, "x.md")) != []
        return
    with pytest.raises(DocError) as caught:
        parse_page(text, "x.md")
    assert str(caught.value).startswith(message)


def test_expected_console_output_is_matched_in_order_with_ellipses() -> None:
    printed = "scheduler           charge_due\nidentity            sched_ab12\nstatus  RELEASED\n"
    assert output_matches(("identity sched_...", "status RELEASED"), printed)
    assert not output_matches(("status RELEASED", "identity sched_..."), printed)  # order
    assert not output_matches(("identity sched_",), printed)  # a whole line, not a prefix
    assert output_matches((), "")


RUNNABLE_PAGE = """\
<!-- file: greeting.txt -->
```text
hello
```

```bash
export GREETING=$(cat greeting.txt)
count=3
sleep 300 &
echo $! > sleeper.pid
mkdir sub && cd sub
```

```python
import os, pathlib
assert os.environ["GREETING"] == "hello", os.environ.get("GREETING")
assert pathlib.Path.cwd().name == "sub"
pathlib.Path("from-python").write_text("x")
```

```console
$ echo "$GREETING $count"; ls
hello ...
from-python
```

```bash
for i in $(seq 3); do test -e never && break; done
ls no-such-file
echo not reached > reached
```
"""


def test_the_runner_follows_a_page_like_a_terminal_and_names_the_failing_line(tmp_path: Path) -> None:
    blocks = parse_page(RUNNABLE_PAGE, "docs/t.md")
    with pytest.raises(PageFailed) as caught:
        run_page("docs/t.md", blocks, tmp_path, page_env(None))
    message = str(caught.value)
    assert message.startswith("docs/t.md:29: `ls no-such-file` failed (exit 2)\nstderr:\n"), message
    assert "no-such-file" in message.split("stderr:", 1)[1]
    scratch = tmp_path / "scratch"
    assert not (scratch / "sub" / "reached").exists()
    pid = int((scratch / "sleeper.pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_runner_shows_what_a_console_command_printed_against_what_the_page_expects(
        tmp_path: Path) -> None:
    page = "```console\n$ echo two\none\n```\n"
    with pytest.raises(PageFailed) as caught:
        run_page("x.md", parse_page(page, "x.md"), tmp_path, page_env(None))
    assert str(caught.value).startswith("x.md:2: `echo two` printed:\n  two\nexpected, in order "
                                        "(`...` matches anything):\n  one")


def test_a_page_that_exits_its_shell_fails_at_once_naming_the_block(tmp_path: Path) -> None:
    page = "```bash\nsleep 300 &\nexit 0\n```\n"
    started = time.monotonic()
    with pytest.raises(PageFailed) as caught:
        run_page("x.md", parse_page(page, "x.md"), tmp_path, page_env(None))
    assert str(caught.value).startswith("x.md:1: this bash block ended the shell (exit?)")
    assert time.monotonic() - started < BLOCK_TIMEOUT_S / 2


def test_a_failing_python_block_shows_its_traceback_in_page_lines(tmp_path: Path) -> None:
    page = "Text.\n\n```python\nx = 1\nassert x == 2, 'x is one'\n```\n"
    with pytest.raises(PageFailed) as caught:
        run_page("x.md", parse_page(page, "x.md"), tmp_path, page_env(None))
    message = str(caught.value)
    assert message.startswith("x.md:3: this python block failed:\n"), message
    assert 'File "x.md", line 5' in message and "assert x == 2, 'x is one'" in message
    assert message.rstrip().endswith("AssertionError: x is one")
