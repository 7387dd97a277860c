""".ci/tier_report.py on pytest's own JUnit reports: a skip at collection (a module's importorskip) is matched by its
reason, not by the "collection skipped" pytest writes as its message; an unexpected skip, a failure or a run with
nothing passed fails the tier."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))

import tier_report  # noqa: E402

MODULE_SKIP = "import pytest\npytest.importorskip('no_such_package_here')\n\ndef test_never():\n    pass\n"
TEST_SKIP = (
    "import pytest\n\n"
    "def test_runs():\n    assert 1 + 1 == 2\n\n"
    "@pytest.mark.skip(reason='needs a CUDA device')\n"
    "def test_gpu():\n    pass\n"
)


def junit(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={report}",
         *files],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    return report


def test_a_collection_skip_is_matched_by_its_reason(tmp_path, capsys):
    report = junit(tmp_path, {"test_mod_skip.py": MODULE_SKIP, "test_plain.py": TEST_SKIP})
    reasons = tier_report.read(report).skip_reasons
    assert any("collection skipped" in r and "no_such_package_here" in r for r in reasons), reasons
    allow = ["needs a CUDA device"]
    assert tier_report.check("t", report, allow) == 1
    assert "unexpected skip" in capsys.readouterr().err
    assert tier_report.check("t", report, [*allow, "could not import 'no_such_package_here'"]) == 0


def test_a_failure_or_nothing_passed_fails_the_tier(tmp_path):
    failing = junit(tmp_path, {"test_fail.py": "def test_fails():\n    assert False\n"})
    assert tier_report.check("t", failing, []) == 1
    only_skipped = junit(tmp_path, {"test_mod_skip.py": MODULE_SKIP})
    assert tier_report.check("t", only_skipped, [".*"]) == 1
    assert tier_report.check("t", tmp_path / "missing.xml", []) == 1
