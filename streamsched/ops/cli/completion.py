"""``streamsched completion bash|zsh``: a completion script generated (with shtab) from the
parser itself, so it never lists a command or flag the CLI does not have."""

from __future__ import annotations

import argparse


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab

    return str(shtab.complete(parser, shell=shell))


def cmd_completion(args: argparse.Namespace) -> int:
    # The root parser rides on the namespace (set by the parser itself), so this module never
    # imports the parser module that imports it.
    print(completion_script(args.root_parser, args.shell))
    return 0
