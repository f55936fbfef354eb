#!/usr/bin/env bash
# Installs the Python SDK (python/, editable) with its test deps (grpcio, protobuf, pytest,
# pytest-asyncio, swe-rex, ruff, grpcio-tools) from PyPI into python3's environment.
# Called by .ci/run; integration/tests/envd_python.rs needs it. Skips pip when all are there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# grpcio-tools is pinned in python/pyproject.toml (the checked-in stubs are its output, byte for
# byte): an installed other version means a reinstall.
installed() {
  "$PY" - 2>/dev/null <<'EOF'
import importlib.metadata as m, tomllib
import weenv, grpc, google.protobuf, pytest, pytest_asyncio, swerex, grpc_tools  # noqa: F401
dev = tomllib.load(open("python/pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
pin = next(r.split("==")[1] for r in dev if r.startswith("grpcio-tools=="))
assert m.version("grpcio-tools") == pin
EOF
}
if installed && command -v ruff >/dev/null; then
  echo "python_deps.sh: already installed"
  exit 0
fi
"$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e "python[test,dev]"
