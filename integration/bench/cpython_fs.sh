#!/usr/bin/env bash
# CPython's regression tests of its filesystem modules (Debian's libpython3.11-testsuite) in a
# container of a lazily pulled image on weenv (fill off: FUSE lowers) and on containerd's
# overlayfs snapshotter, module by module; prints the table `module | overlayfs | weenv`
# (tests run, unittest's verdict with skip/failure counts, failing tests; `same` when weenv
# gives the same line). This is the full list; CI runs a subset of the same test
# (integration/tests/cpython_fs.rs, CI_MODULES). Takes ~10-15 min on a 2-core machine.
#
# Needs root, containerd, ctr, runc, docker-registry, skopeo, debootstrap, fuse3:
#   integration/bench/cpython_fs.sh            # or MODULES="test_os test_stat" ...
set -euo pipefail
cd "$(dirname "$0")/../.."
MODULES=${MODULES:-"test_os test_posix test_shutil test_tarfile test_zipfile test_glob \
test_pathlib test_stat test_fileio test_mmap test_tempfile test_compileall test_importlib \
test_genericpath test_posixpath test_filecmp test_zipimport test_py_compile test_fnmatch \
test_fileinput test_linecache test_io"}
CPYTHON_TESTS="$MODULES" exec cargo test -p weenv-integration --test cpython_fs -- \
  --ignored --nocapture --test-threads=1
