"""``streamsched completion bash|zsh``: a completion script generated (with shtab) from the
parser itself, so it never lists a command or flag the CLI does not have."""

from __future__ import annotations

import argparse


def completion_script(shell: str) -> str:
    import shtab

    from streamsched.ops.cli.parser import build_parser

    return str(shtab.complete(build_parser(), shell=shell))


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(args.shell))
    return 0
