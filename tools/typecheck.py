"""mypy over the package as it installs: ``realtime/`` and ``codecs/`` as ``omni_stream.realtime`` / ``.codecs``.

The repository keeps those layers at the top level (pyproject maps them into the package), where a plain
``mypy codecs`` would take ``codecs`` for the standard library's module. So the check runs on a throwaway
tree of symbolic links laid out as the installed package. Usage: ``python tools/typecheck.py [mypy args]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"realtime": ROOT / "realtime", "codecs": ROOT / "codecs"}


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="omni-typecheck-") as tmp:
        package = Path(tmp) / "omni_stream"
        package.mkdir()
        for entry in (ROOT / "omni_stream").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for name, target in MAPPED.items():
            (package / name).symlink_to(target, target_is_directory=True)
        os.environ["MYPYPATH"] = tmp
        cwd = os.getcwd()
        os.chdir(tmp)  # module names come from the linked layout, not from the repository's folders
        try:
            out, err, status = api.run(
                ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"),
                 "-p", "omni_stream", *argv]
            )  # fmt: skip
        finally:
            os.chdir(cwd)
    sys.stdout.write(out.replace(tmp + os.sep, ""))
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
