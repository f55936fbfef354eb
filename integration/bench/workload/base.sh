#!/usr/bin/env bash
# Stage 1 of the workload build: the base root filesystem (Debian bookworm minbase + python3 +
# venv support + a compiler toolchain), cached as a tarball so reruns need no mirror.
# Usage: base.sh CACHE_DIR   -> CACHE_DIR/base-rootfs.tar
set -euo pipefail
CACHE=$1
OUT="$CACHE/base-rootfs.tar"
[ -s "$OUT" ] && exit 0
mirror() { # the first bookworm source of the machine's apt configuration
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1=="deb" && / bookworm /{for(i=2;i<=NF;i++) if($i ~ /^https?:/){print $i; exit}}' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'BEGIN{RS=""} /Suites:[^\n]*bookworm( |\n|$)/ && !/Enabled: *no/ {
            if (match($0, /URIs: *[^ \n]+/)) { u=substr($0, RSTART, RLENGTH); sub(/URIs: */, "", u); print u; exit } }' "$f"
    done
}
MIRROR=${MIRROR:-$(mirror | head -1)}
[ -n "$MIRROR" ] || { echo "no bookworm mirror in the apt configuration (set MIRROR=)" >&2; exit 2; }
PKGS=${BASE_PACKAGES:-python3,python3-venv,gcc,make,libc6-dev}
root=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm minbase + $PKGS from $MIRROR" >&2
debootstrap --variant=minbase --include="$PKGS" bookworm "$root/rootfs" "$MIRROR" >"$root/log" 2>&1 ||
    { tail -20 "$root/log" >&2; exit 1; }
# Like Debian's own container images: no apt caches or package lists.
rm -rf "$root/rootfs/var/cache/apt" "$root/rootfs/var/lib/apt/lists"
mkdir -p "$root/rootfs/var/cache/apt" "$root/rootfs/var/lib/apt/lists"
# No device nodes (containerd provides /dev).
tar -C "$root/rootfs" --numeric-owner --xattrs --exclude="./dev/*" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
