"""Runs CPython regression test modules and prints one canonical line per module.

Debian's `libpython3.11-testsuite` in the python-testsuite test image; run in a container:
`python3 cpython_tests.py test_os test_stat ...`. Each module runs on its own under regrtest
(`python3 -m test -v MODULE`) in a fresh working directory; the line says how many tests ran,
unittest's verdict (with its skip and failure counts) and which tests failed or errored, so the
lines of two snapshotters are equal when the filesystem behaves the same.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile


def run(module: str) -> str:
    work = tempfile.mkdtemp(prefix=f"{module}-")
    env = {**os.environ, "TMPDIR": work}
    p = subprocess.run(
        [sys.executable, "-m", "test", "-v", "--timeout", "900", module],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = p.stdout + p.stderr
    ran = sum(int(n) for n in re.findall(r"^Ran (\d+) tests?", out, re.MULTILINE))
    verdicts = [
        v.strip()
        for v in re.findall(r"^((?:OK|FAILED)(?: \(.*\))?)$", out, re.MULTILINE)
    ]
    bad = sorted(set(re.findall(r"^(?:FAIL|ERROR): (\S+ \(\S+\))", out, re.MULTILINE)))
    if os.environ.get("CPYTHON_TESTS_LOG"):
        sys.stderr.write(out)
    return f"{module}: ran={ran} verdict={';'.join(verdicts)} exit={p.returncode} failed={bad}"


def main() -> None:
    for module in sys.argv[1:]:
        print(run(module), flush=True)


if __name__ == "__main__":
    main()
