#!/bin/sh
# Dynamic assembly (baseline): install the harness at init with pip from a wheelhouse
# (WHEELHOUSE: a directory, mounted by the benchmark, or an http URL), then start the agent.
# HARNESS selects the pinned set (harness-$HARNESS.txt in the wheelhouse).
set -e
W=${WHEELHOUSE:-/wheelhouse}
python3 -m venv /opt/harness
/opt/harness/bin/pip install -q --no-index --disable-pip-version-check --find-links "$W" -r "$W/harness-$HARNESS.txt"
case $W in
    http*) python3 -c "import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())" "$W/agent.py" >/opt/harness/agent.py ;;
    *) cp "$W/agent.py" /opt/harness/agent.py ;;
esac
exec /opt/harness/bin/python /opt/harness/agent.py
