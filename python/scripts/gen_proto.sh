#!/usr/bin/env bash
# Regenerates the checked-in gRPC stubs of envd/proto/weenv/envd/v1/envd.proto into
# src/weenv/envd/v1/ (needs grpcio-tools: pip install -e 'python[dev]').
# tests/test_proto_stubs.py fails when they are out of date.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m grpc_tools.protoc -I ../envd/proto --python_out=src --pyi_out=src --grpc_python_out=src \
  ../envd/proto/weenv/envd/v1/envd.proto
