"""What the role tests share: the reference workflows loaded under a namespace, the CLI as a
user runs it, and ACL bindings compared without their explanations."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from types import ModuleType

from streamsched.ops import acl
from streamsched.testing import ROOT


def load_reference(name: str, env: dict[str, str]) -> ModuleType:
    """A fresh copy of consumers/<name>.py imported under ``env`` (e.g. STREAMSCHED_NAMESPACE, so
    its topics and group carry the namespace); the process environment is restored after."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_{uuid.uuid4().hex}",
                                                      ROOT / "consumers" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m streamsched ARGS`` from the checkout, with ``env`` added."""
    return subprocess.run([sys.executable, "-m", "streamsched", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def plan_keys(plan: list[dict[str, str]]) -> list[tuple[str, ...]]:
    """The bindings of an ``acl plan -o json`` output, sorted, as :meth:`acl.Acl.key`."""
    return sorted(acl.Acl(**d).key() for d in plan)
