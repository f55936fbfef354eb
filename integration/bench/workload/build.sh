#!/usr/bin/env bash
# Builds the realistic rollout workload of issue 12 offline from real parts, into a local
# registry's storage, with weenv's own tools (weenv-convert group/plan) and the two baselines:
#   base group      Debian bookworm minbase + python3 + python3-venv + gcc/make/libc6-dev
#   repo groups     toolz, six, idna from their PyPI sdists (with their test suites) at /src/repo
#   tasks           bug-introducing patches (workload.py BUGS), validated in a chroot of the base
#                   + evaluator: tests pass pristine, fail with the patch, pass after the revert
#                   (the agent stand-in's own revert); a task that does not is dropped
#   harness groups  v1/v2: a venv of real LLM SDKs (openai, anthropic, pydantic, httpx; two
#                   pinned version sets, harness-v*.txt) + agent.py at /opt/harness
#   evaluator group a pytest venv at /opt/eval + /eval/run.sh (writes /logs/reward.txt)
#   mutation groups the pre-applied form of every task (weenv-convert group mutate)
#   plans           one per task x harness (at-init mutation), composed and published as envs/
#   static bundles  one gzip image per task x harness (base layer shared, FROM-style)
#   dynamic         one gzip image per task; the harness is pip-installed at init from the
#                   wheelhouse (assemble.sh)
# and prints Table 1 (artifacts, stored bytes per strategy).
#
# Downloads (PyPI sdists and wheels, the debootstrap tarball) are cached under $CACHE
# (default /var/tmp/weenv-workload): a rerun is offline. Outputs:
#   $CACHE/registry    docker-registry storage (serve it: rootdirectory = this dir)
#   $CACHE/out         workload.json (refs without host, tasks, expected rewards), tasks/*.diff,
#                      plans/ (rendered for the build registry; workload.py plans re-renders),
#                      wheelhouse/ (dynamic assembly: wheels + harness-v*.txt + agent.py),
#                      table1.md
# Needs root (chroot, debootstrap), debootstrap, docker-registry, skopeo, patch, python3, pip
# and weenv-convert (WEENV_BIN, default target/debug).
# BUNDLES_WEENV=1 also converts every bundle to weenv (bundles-weenv/, for the lazy-bundle
# mode; converts the shared base once per bundle).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${WEENV_BIN:-$(cd "$HERE/../../.." && pwd)/target/debug}
CACHE=${CACHE:-/var/tmp/weenv-workload}
EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
B="$CACHE/build"
OUT="$CACHE/out"
WH="$CACHE/wheelhouse"
PY="python3 $HERE/workload.py"
for b in debootstrap docker-registry skopeo patch python3 pip chroot; do command -v $b >/dev/null || { echo "missing $b" >&2; exit 2; }; done
[ -x "$BIN/weenv-convert" ] || { echo "missing $BIN/weenv-convert (cargo build -p weenv-converter)" >&2; exit 2; }
log() { echo "[$(date +%T)] $*" >&2; }
mkdir -p "$CACHE" "$WH" "$CACHE/sdists"

PIDS=()
ROOT="$B/rootfs"
cleanup() {
    set +e
    for m in wheelhouse proc dev; do mountpoint -q "$ROOT/$m" 2>/dev/null && umount -l "$ROOT/$m"; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
}
trap cleanup EXIT

# ---- downloads (cached) ---------------------------------------------------------------------
"$HERE/base.sh" "$CACHE"
log "base rootfs: $(du -h "$CACHE/base-rootfs.tar" | cut -f1)"
for r in $($PY repos); do
    d=$($PY repo-dir "$r")
    [ -s "$CACHE/sdists/$d.tar.gz" ] || pip download -q --no-deps --no-binary :all: -d "$CACHE/sdists" "$($PY repo-sdist "$r")"
done
PIPP="--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any"
for r in harness-v1 harness-v2 evaluator; do
    if ! pip download -q --no-index --find-links "$WH" --no-deps -d "$WH/.check" $PIPP -r "$HERE/$r.txt" >/dev/null 2>&1; then
        log "downloading the wheels of $r"
        pip download -q --no-deps -d "$WH" $PIPP -r "$HERE/$r.txt"
    fi
    rm -rf "$WH/.check"
done

# ---- scratch root: base + evaluator venv + harness venvs (built in a chroot of the base) ----
rm -rf "$B"; mkdir -p "$ROOT" "$B/src" "$OUT"
tar -C "$ROOT" -xf "$CACHE/base-rootfs.tar"
mount --bind /dev "$ROOT/dev"; mount -t proc proc "$ROOT/proc"
mkdir -p "$ROOT/wheelhouse"; mount --bind "$WH" "$ROOT/wheelhouse"; mount -o remount,bind,ro "$ROOT/wheelhouse"
cp "$HERE"/harness-v1.txt "$HERE"/harness-v2.txt "$HERE"/evaluator.txt "$ROOT/tmp/"
CHROOT="env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 $(command -v chroot)"
# The images clamp every mtime to $EPOCH (group create --mtime, the bundles' tar --clamp-mtime),
# but pip writes each .pyc with its source's install-time mtime: left so, every .pyc of the
# image is stale against its source and every import recompiles (and rewrites) the whole venv,
# on any snapshotter. So the venv's mtimes are clamped here first and its bytecode compiled
# against the clamped sources; the check after it fails the build if an import still compiles.
clamp() { # $1 = path in the root: every mtime after $EPOCH set to $EPOCH
    find "$ROOT$1" -newermt "@$EPOCH" -exec touch -h -d "@$EPOCH" {} +
}
venv() { # $1 = path in the root, $2 = requirements
    $CHROOT "$ROOT" /usr/bin/python3 -m venv "$1"
    $CHROOT "$ROOT" "$1/bin/pip" install -q --no-index --disable-pip-version-check --find-links /wheelhouse -r "/tmp/$2"
    clamp "$1"
    # Timestamp-checked .pyc (python's default), recompiled against the clamped source mtimes.
    $CHROOT "$ROOT" "$1/bin/python" -m compileall -q -j 0 --invalidation-mode timestamp "$1" >/dev/null ||
        log "compileall: some files under $1 do not compile (they stay without bytecode, as pip left them)"
    clamp "$1"
}
stale_pyc() { # $1 = path in the root, then a command run in the root: fails if it wrote bytecode
    local p=$1; shift
    touch -d "@$((EPOCH + 1))" "$B/pyc-mark"
    $CHROOT "$ROOT" "$@"
    local n; n=$(find "$ROOT$p" -name '*.pyc' -newer "$B/pyc-mark" | wc -l)
    [ "$n" = 0 ] || { echo "$n .pyc under $p were recompiled by: $*" >&2; exit 1; }
}
venv /opt/eval evaluator.txt
stale_pyc /opt/eval /opt/eval/bin/python -c "import pytest"
mkdir -p "$ROOT/eval"; cp "$HERE/eval-run.sh" "$ROOT/eval/run.sh"
mkdir -p "$B/eval/opt" "$B/eval/eval"
cp -a "$ROOT/opt/eval" "$B/eval/opt/eval"; cp "$HERE/eval-run.sh" "$B/eval/eval/run.sh"
declare -A INSTALL
for h in v1 v2; do
    venv /opt/harness "harness-$h.txt"
    cp "$HERE/agent.py" "$ROOT/opt/harness/agent.py"
    stale_pyc /opt/harness /opt/harness/bin/python -c "import openai, anthropic, pydantic, httpx"
    mkdir -p "$B/harness-$h/opt"; mv "$ROOT/opt/harness" "$B/harness-$h/opt/harness"
    INSTALL[$h]=$(du -sb "$B/harness-$h/opt/harness" | cut -f1)
    log "harness $h: $(du -sh "$B/harness-$h" | cut -f1), $(find "$B/harness-$h" -type f | wc -l) files"
done

# ---- repositories and tasks (validated) -----------------------------------------------------
for r in $($PY repos); do
    d=$($PY repo-dir "$r")
    tar -C "$B/src" -xzf "$CACHE/sdists/$d.tar.gz"; mv "$B/src/$d" "$B/src/$r"
done
rm -rf "$OUT/tasks"; $PY patches "$B/src" "$OUT/tasks"
log "validating tasks (chroot of base + evaluator)"
$PY validate "$ROOT" "$B/src" "$OUT/tasks"
cp "$OUT/tasks/tasks.json" "$B/tasks.json"

# ---- registry -------------------------------------------------------------------------------
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REG="127.0.0.1:$PORT"
cat > "$B/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $CACHE/registry}, delete: {enabled: true}}
http: {addr: $REG}
EOF
docker-registry serve "$B/registry.yml" >"$B/registry.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do curl -s "http://$REG/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
WC() { "$BIN/weenv-convert" --plain-http "$REG" "$@"; }
group() { WC group create --mtime "$EPOCH" "$@" >"$B/group.log" 2>&1 || { cat "$B/group.log" >&2; exit 1; }; tail -1 "$B/group.log" >&2; }

# ---- weenv groups ---------------------------------------------------------------------------
log "groups: base"
group --kind base --name debian-bookworm-python3-gcc --tar "$CACHE/base-rootfs.tar" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["python3"]' --push "$REG/weenv/base:1"
for r in $($PY repos); do
    log "groups: repository $r"
    mkdir -p "$B/repo-$r/src"; cp -a "$B/src/$r" "$B/repo-$r/src/repo"
    group --kind task --name "$r" --dir "$B/repo-$r" --workdir /src/repo --env "WEENV_TESTS=$($PY repo-tests "$r")" \
        --push "$REG/weenv/repo-$r:1"
done
for h in v1 v2; do
    log "groups: harness $h"
    group --kind harness --name "harness-$h" --dir "$B/harness-$h" --env PATH=/opt/harness/bin \
        --cmd '["/opt/harness/bin/python", "/opt/harness/agent.py"]' --push "$REG/weenv/harness:$h"
done
log "groups: evaluator"
group --kind evaluator --name eval --dir "$B/eval" --push "$REG/weenv/eval:1"
for t in $($PY task-ids "$B/tasks.json"); do
    r=$($PY task-repo "$B/tasks.json" "$t")
    WC group mutate --base-group "$REG/weenv/repo-$r:1" --patch "$OUT/tasks/$r/$t.diff" --root /src/repo \
        --name "$t" --push "$REG/weenv/mut-$t:1" >"$B/mutate.log" 2>&1 || { cat "$B/mutate.log" >&2; exit 1; }
done
log "mutation groups: $($PY task-ids "$B/tasks.json" | wc -w)"

# ---- baselines: static bundles and dynamic-assembly images (gzip, FROM-style shared base) ----
LAYOUT="$B/oci"; mkdir -p "$B/layers"
if [ ! -s "$CACHE/base-rootfs.tar.gz" ]; then gzip -n -c "$CACHE/base-rootfs.tar" >"$CACHE/base-rootfs.tar.gz.tmp"; mv "$CACHE/base-rootfs.tar.gz.tmp" "$CACHE/base-rootfs.tar.gz"; fi
TARF="--sort=name --owner=0 --group=0 --numeric-owner --mtime=@$EPOCH --clamp-mtime"
bugged() { # $1 = task, $2 = repo -> $B/bug-$1/src/repo
    rm -rf "$B/bug-$1"; mkdir -p "$B/bug-$1/src"; cp -a "$B/src/$2" "$B/bug-$1/src/repo"
    patch -s -p1 --no-backup-if-mismatch -d "$B/bug-$1/src/repo" -i "$OUT/tasks/$2/$1.diff"
}
mkdir -p "$B/assemble/opt/assemble"; cp "$HERE/assemble.sh" "$B/assemble/opt/assemble/assemble.sh"
STDPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for t in $($PY task-ids "$B/tasks.json"); do
    r=$($PY task-repo "$B/tasks.json" "$t")
    bugged "$t" "$r"
    env_json=$($PY task-env "$B/tasks.json" "$t")
    for h in v1 v2; do
        l="$B/layers/bundle-$t-$h.tar.gz"
        tar -C "$B/bug-$t" $TARF -cf - . -C "$B/harness-$h" . -C "$B/eval" . | gzip -n >"$l"
        cat >"$B/cfg.json" <<EOF
{"Env": ["PATH=/opt/harness/bin:$STDPATH", "WEENV_TESTS=$($PY repo-tests "$r")", $env_json],
 "WorkingDir": "/src/repo", "Cmd": ["/opt/harness/bin/python", "/opt/harness/agent.py"]}
EOF
        $PY oci-image "$LAYOUT" "bundle-$t-$h" "$B/cfg.json" "$CACHE/base-rootfs.tar.gz" "$l"
        skopeo copy -q --dest-tls-verify=false "oci:$LAYOUT:bundle-$t-$h" "docker://$REG/bundles/$t:$h"
        rm -f "$l" "$l.diffid"
    done
    l="$B/layers/dynamic-$t.tar.gz"
    tar -C "$B/bug-$t" $TARF -cf - . -C "$B/eval" . -C "$B/assemble" . | gzip -n >"$l"
    cat >"$B/cfg.json" <<EOF
{"Env": ["PATH=$STDPATH", "WEENV_TESTS=$($PY repo-tests "$r")", "HARNESS=v1", "WHEELHOUSE=/wheelhouse", $env_json],
 "WorkingDir": "/src/repo", "Cmd": ["/bin/sh", "/opt/assemble/assemble.sh"]}
EOF
    $PY oci-image "$LAYOUT" "dynamic-$t" "$B/cfg.json" "$CACHE/base-rootfs.tar.gz" "$l"
    skopeo copy -q --dest-tls-verify=false "oci:$LAYOUT:dynamic-$t" "docker://$REG/dynamic/$t:1"
    rm -f "$l" "$l.diffid"; rm -rf "$B/bug-$t"
    log "bundles and dynamic image of $t"
done
if [ "${BUNDLES_WEENV:-0}" = 1 ]; then
    for t in $($PY task-ids "$B/tasks.json"); do for h in v1 v2; do
        WC image "$REG/bundles/$t:$h" "$REG/bundles-weenv/$t:$h" >"$B/convert.log" 2>&1 || { cat "$B/convert.log" >&2; exit 1; }
    done; log "weenv bundles of $t"; done
fi
# Dynamic assembly's wheelhouse: both harness sets, their pins and the agent.
rm -rf "$OUT/wheelhouse"; mkdir -p "$OUT/wheelhouse"
cp -l "$WH"/*.whl "$OUT/wheelhouse/"; cp "$HERE"/harness-v1.txt "$HERE"/harness-v2.txt "$HERE/agent.py" "$OUT/wheelhouse/"

# ---- workload description, plans, composed environments, Table 1 -----------------------------
$PY describe "$B/tasks.json" "${BUNDLES_WEENV:-0}" "v1=${INSTALL[v1]}" "v2=${INSTALL[v2]}" >"$OUT/workload.json"
rm -rf "$OUT/plans" "$OUT/plans-pre"
$PY plans "$OUT/workload.json" "$REG" "$OUT/plans" >/dev/null
$PY plans "$OUT/workload.json" "$REG" "$OUT/plans-pre" --pre-applied >/dev/null
for p in "$OUT"/plans/*.toml; do
    n=$(basename "$p" .toml)
    WC plan compose "$p" --cache-dir "$B/resolve-cache" --push "$REG/envs/${n%--*}:${n#*--}" >"$B/compose.log" 2>&1 ||
        { cat "$B/compose.log" >&2; exit 1; }
done
log "composed $(ls "$OUT"/plans/*.toml | wc -l) environments (envs/TASK:HARNESS)"
{
    $PY table "$OUT/workload.json" "$REG"
    echo
    echo '`weenv-convert plan stats` on the plans (at-init mutations):'
    echo '```'
    WC plan stats --cache-dir "$B/resolve-cache" "$OUT"/plans/*.toml
    echo '```'
} >"$OUT/table1.md"
cat "$OUT/table1.md"
# Keep the caches, drop the scratch tree (the registry storage and out/ are the product).
cleanup; PIDS=()
rm -rf "$B"
log "workload: $(du -sh "$CACHE/registry" | cut -f1) in $CACHE/registry; description in $OUT/workload.json"
