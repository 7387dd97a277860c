"""What a CI tier ran, from its pytest JUnit report, and whether it ran what it should.

``tier_report.py require NAME MODULE...``: exits 1, naming them, when any MODULE cannot be found in this Python (a
tier whose install failed would otherwise skip every test that needs it, and pass).

``tier_report.py check NAME REPORT [--allow REGEX]...``: prints ``NAME: P passed, F failed, E errors, S skipped``
and exits 1 when the report is missing, when a test failed, when the tier ran no test (none collected, or every one
skipped), or when a test was skipped for a reason no ``--allow`` pattern matches: in CI every skip must be one the
tier expects (a GPU test on a CPU machine, another tier's tests), never a package or tool that should have been
there.

``tier_report.py summary REPORT...``: one line of counts per report (its tier is the file's stem), for the end of
the run; a missing report is said so.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Counts:
    tests: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    skip_reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.tests - self.failed - self.errors - self.skipped

    def line(self, name: str) -> str:
        return f"{name}: {self.passed} passed, {self.failed} failed, {self.errors} errors, {self.skipped} skipped"


def read(report: Path) -> Counts:
    """Counts over every test case of the report (one ``testsuite`` per pytest run)."""
    counts = Counts()
    for case in ET.parse(report).getroot().iter("testcase"):
        counts.tests += 1
        if case.find("failure") is not None:
            counts.failed += 1
        elif case.find("error") is not None:
            counts.errors += 1
        elif (skipped := case.find("skipped")) is not None:
            counts.skipped += 1
            # a skip at collection (importorskip at module level) has the message "collection skipped" and its
            # reason in the element's text; a test's skip has its reason in the message
            counts.skip_reasons.append(" ".join(filter(None, (skipped.get("message"), skipped.text))))
    return counts


def require(name: str, modules: list[str]) -> int:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{name} tier: its packages are missing ({', '.join(missing)}): the install failed", file=sys.stderr)
        return 1
    return 0


def check(name: str, report: Path, allow: list[str]) -> int:
    if not report.is_file():
        print(f"{name}: no report ({report}): pytest did not run to the end", file=sys.stderr)
        return 1
    counts = read(report)
    print(counts.line(name))
    if counts.passed == 0:
        print(f"{name}: no test ran (collected {counts.tests}, all skipped or none)", file=sys.stderr)
        return 1
    unexpected = sorted({r for r in counts.skip_reasons if not any(re.search(a, r) for a in allow)})
    for reason in unexpected:
        print(f"{name}: unexpected skip: {reason}", file=sys.stderr)
    return 1 if unexpected or counts.failed or counts.errors else 0


def summary(reports: list[Path]) -> int:
    print("== tiers")
    for report in reports:
        print(read(report).line(report.stem) if report.is_file() else f"{report.stem}: did not run")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("require")
    req.add_argument("name")
    req.add_argument("modules", nargs="+")
    chk = sub.add_parser("check")
    chk.add_argument("name")
    chk.add_argument("report", type=Path)
    chk.add_argument("--allow", action="append", default=[], help="a regular expression of an expected skip reason")
    summ = sub.add_parser("summary")
    summ.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "require":
        return require(args.name, args.modules)
    if args.command == "check":
        return check(args.name, args.report, args.allow)
    return summary(args.reports)


if __name__ == "__main__":
    sys.exit(main())
