"""The type check (issue 32 item 2): mypy over engine/ and app/, with pyproject's [tool.mypy] settings.

Neither package may have more errors than `.ci/mypy_baseline.txt` allows ("package count" per line); engine's
is 0. When a count falls, lower its line (this says so), so the baseline only ever shrinks. One mypy run
checks every package named there. Run from the repository root, in the environment the tests run in:
`python .ci/mypy_check.py`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

BASELINE = Path(__file__).with_name("mypy_baseline.txt")
_ERROR = re.compile(r"^([A-Za-z_][\w]*)[/\\][^:]*:\d+: error:", re.MULTILINE)


def read_baseline(text: str) -> dict[str, int]:
    """{package: allowed errors} from lines "package count" (blank lines and # comments skipped)."""
    allowed: dict[str, int] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, count = line.split()
            allowed[package] = int(count)
    return allowed


def count_errors(report: str, packages: list[str]) -> Counter[str]:
    """Errors per package in a mypy report (by the top folder of each error's file)."""
    found = Counter(m.group(1) for m in _ERROR.finditer(report))
    return Counter({p: found[p] for p in packages})


def main() -> int:
    allowed = read_baseline(BASELINE.read_text())
    packages = list(allowed)
    done = subprocess.run([sys.executable, "-m", "mypy", *packages], capture_output=True, text=True)
    report = done.stdout + done.stderr
    # mypy exits 1 for type errors, and so does Python when mypy is not installed: a check that did not run
    # must not read as "0 errors", so its own summary line is required.
    finished = re.search(r"^(Success: no issues found in \d+ source files?|Found \d+ errors? in \d+ files?)", report, re.MULTILINE)
    if done.returncode not in (0, 1) or "INTERNAL ERROR" in report or not finished:
        print(report)
        print("mypy did not finish its check")
        return 1
    counts = count_errors(report, packages)
    failed = False
    for package in packages:
        n, limit = counts[package], allowed[package]
        if n > limit:
            print("\n".join(line for line in report.splitlines() if line.startswith(package + "/")))
            print(f"mypy {package}: {n} errors, more than the {limit} {BASELINE.name} allows; fix the new ones")
            failed = True
        elif n < limit:
            print(f"mypy {package}: {n} errors, fewer than {limit}: lower its line in {BASELINE} to {n}")
        else:
            print(f"mypy {package}: {n} errors (baseline {limit})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
