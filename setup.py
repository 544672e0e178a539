"""Build hook: ship the Avro schemas inside the wheel.

Everything else is declared in pyproject.toml. The schemas live at the repository's top level
(``schemas/*.avsc``: the wire contract other languages read), so setuptools' package discovery does
not see them; this copies them into the built package as ``streamsched/_schemas``, where
:func:`streamsched.wire.avro.schema_dir` looks when no ``schemas/`` checkout is beside the package.
An editable install needs nothing: it reads the checkout's ``schemas/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithSchemas(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        source = HERE / "schemas"
        schemas = sorted(source.glob("*.avsc"))
        if not schemas:
            # A wheel without its schemas cannot encode or decode anything: fail the build.
            raise RuntimeError(f"no Avro schemas in {source}")
        target = Path(self.build_lib) / "streamsched" / "_schemas"
        target.mkdir(parents=True, exist_ok=True)
        for schema in schemas:
            shutil.copyfile(schema, target / schema.name)


setup(cmdclass={"build_py": BuildPyWithSchemas})
