#!/bin/sh
# Evaluator of the weenv workload: runs the repository's tests (WEENV_TESTS, set by the
# repository group) with the evaluator's pytest and writes the reward: 1 pass, 0 fail.
cd "${REPO:-/src/repo}" || exit 2
mkdir -p /logs
if /opt/eval/bin/python -m pytest -q -x -p no:cacheprovider $WEENV_TESTS >/logs/tests.log 2>&1; then
    r=1
else
    r=0
fi
echo "$r" >/logs/reward.txt
tail -1 /logs/tests.log
echo "REWARD $r"
