"""The checked-in stubs are what envd.proto generates (rerun python/scripts/gen_proto.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(ROOT / "envd/proto"),
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "envd/proto/weenv/envd/v1/envd.proto"),
        ],
        check=True,
    )
    for name in ("envd_pb2.py", "envd_pb2.pyi", "envd_pb2_grpc.py"):
        got = (tmp_path / "weenv/envd/v1" / name).read_text()
        want = (ROOT / "python/src/weenv/envd/v1" / name).read_text()
        assert got == want, f"{name} is stale: run python/scripts/gen_proto.sh"
