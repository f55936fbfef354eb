#!/usr/bin/env bash
# Builds the OCI image the Kubernetes DaemonSets of config/k8s/ run (weenv-snapshotter, whose
# `keeper` subcommand is the weenv-fuse-keeper DaemonSet), offline: no base image, no network.
# The root filesystem is the weenv-snapshotter binary, the shared libraries it links (found with
# ldd, copied from this machine), the host's CA bundle (registries over TLS; the daemon also has
# built-in web roots), /etc/passwd, /etc/nsswitch.conf and empty mountpoint dirs. No shell and
# no fusermount3: the probes are HTTP and the daemon, root in a privileged pod, mounts
# /dev/fuse with mount(2) itself. umoci builds the OCI layout; skopeo writes the archive for
# `ctr images import` and pushes.
#
#   scripts/build-image.sh [options]
#     --bin-dir DIR      take weenv-snapshotter from DIR (e.g. target/debug) instead of building
#                        it with `cargo build --release -p weenv-snapshotter --bins`
#                        (into $CARGO_TARGET_DIR, default target/)
#     --out DIR          output directory (default target/image): DIR/oci is the OCI layout (tag
#                        TAG), DIR/weenv-snapshotter-TAG.oci.tar the OCI archive
#                        (`ctr -n k8s.io images import DIR/weenv-snapshotter-TAG.oci.tar`)
#     --name NAME        image name (default ghcr.io/weenv/weenv-snapshotter, as config/k8s/)
#     --tag TAG          image tag (default: the workspace version, as config/k8s/)
#     --push REF         also copy the image to registry reference REF with skopeo
#                        (docker://REF; e.g. registry.example:5000/weenv/weenv-snapshotter:0.1.0)
#     --insecure         with --push: plain HTTP / no TLS verification (skopeo --dest-tls-verify=false)
#     --docker-archive   also write DIR/weenv-snapshotter-TAG.docker.tar (`docker load -i`)
#     --with-shell       add busybox-static as /bin/sh and its applets (for `kubectl exec`
#                        debugging; the DaemonSets do not need it)
#     --print-ref        print NAME:TAG and exit (what config/k8s/ must name)
# Needs umoci, skopeo, ldd, tar (scripts/deps.sh) and root or a user that can chown (umoci
# unpack/repack). Prints the image's reference, digest and size at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

name=ghcr.io/weenv/weenv-snapshotter
tag=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
bin_dir=
out=target/image
push=
insecure=false
docker_archive=false
with_shell=false
print_ref=false
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --insecure) insecure=true; shift ;;
    --docker-archive) docker_archive=true; shift ;;
    --with-shell) with_shell=true; shift ;;
    --print-ref) print_ref=true; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$tag" ] || { echo "build-image: no version in Cargo.toml; pass --tag" >&2; exit 2; }
if $print_ref; then echo "$name:$tag"; exit 0; fi
for b in umoci skopeo ldd tar; do
  command -v "$b" >/dev/null || { echo "build-image: $b not found (scripts/deps.sh)" >&2; exit 1; }
done

if [ -z "$bin_dir" ]; then
  echo "==> cargo build --release -p weenv-snapshotter --bins"
  cargo build --release -p weenv-snapshotter --bins
  bin_dir=${CARGO_TARGET_DIR:-target}/release
fi
bin=$bin_dir/weenv-snapshotter
[ -x "$bin" ] || { echo "build-image: $bin is not an executable" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
layout=$out/oci
rm -rf "$layout"
img=$layout:$tag

umoci init --layout "$layout"
umoci new --image "$img"
umoci unpack --image "$img" "$work/bundle" >/dev/null
rootfs=$work/bundle/rootfs

# Directories: mountpoints of the DaemonSets' volumes (the runtime would create them too).
install -d -m 0755 "$rootfs"/{usr/local/bin,etc/weenv,etc/ssl/certs,etc/containerd/certs.d,proc,sys,dev,run/weenv,run/containerd,var/lib/weenv-snapshotter,root}
install -d -m 1777 "$rootfs/tmp"
install -m 0755 "$bin" "$rootfs/usr/local/bin/weenv-snapshotter"

# Shared libraries (and the dynamic loader) at the paths ldd resolves them to.
copy_libs() {
  local f=$1 lib
  # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)"
  for lib in $(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    [ -e "$rootfs$lib" ] && continue
    install -d "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
}
copy_libs "$bin"

if $with_shell; then
  busybox=$(command -v busybox) || { echo "build-image: --with-shell needs busybox-static" >&2; exit 1; }
  install -d "$rootfs/bin"
  install -m 0755 "$busybox" "$rootfs/bin/busybox"
  copy_libs "$busybox"   # nothing when it is busybox-static
  for a in $("$busybox" --list); do
    [ "$a" = busybox ] || ln -sf busybox "$rootfs/bin/$a"
  done
fi

# TLS: the host's CA bundle, where the daemon looks for it (registry.system_roots).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
else
  echo "build-image: warning: no /etc/ssl/certs/ca-certificates.crt on this machine; the image trusts only the daemon's built-in web roots" >&2
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"

# The binary must run inside the rootfs with only what was copied.
if [ "$(id -u)" = 0 ] && command -v chroot >/dev/null; then
  chroot "$rootfs" /usr/local/bin/weenv-snapshotter --version >/dev/null ||
    { echo "build-image: weenv-snapshotter does not run inside the image's rootfs" >&2; exit 1; }
fi

version=$("$bin" --version | awk '{print $2}')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
umoci repack --image "$img" --history.created_by "scripts/build-image.sh" \
  --history.comment "weenv-snapshotter $version and its shared libraries" "$work/bundle" >/dev/null
path_env=PATH=/usr/local/bin
$with_shell && path_env=PATH=/usr/local/bin:/bin
label_args=()
for kv in \
  "org.opencontainers.image.title=weenv-snapshotter" \
  "org.opencontainers.image.description=weenv lazy-pulling containerd snapshotter daemon (and its FUSE session keeper: the keeper subcommand)" \
  "org.opencontainers.image.version=$version" \
  "org.opencontainers.image.revision=$revision" \
  "org.opencontainers.image.created=$created" \
  "org.opencontainers.image.licenses=Apache-2.0"; do
  label_args+=(--config.label "$kv" --manifest.annotation "$kv")
done
umoci config --image "$img" --no-history \
  --config.entrypoint /usr/local/bin/weenv-snapshotter \
  --config.cmd=--config --config.cmd=/etc/weenv/config.toml \
  --config.env "$path_env" --config.workingdir / --config.user 0:0 \
  --config.stopsignal SIGTERM \
  "${label_args[@]}"
umoci gc --layout "$layout"

archive=$out/weenv-snapshotter-$tag.oci.tar
rm -f "$archive"
skopeo copy --quiet "oci:$layout:$tag" "oci-archive:$archive:$name:$tag"
if $docker_archive; then
  rm -f "$out/weenv-snapshotter-$tag.docker.tar"
  skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$out/weenv-snapshotter-$tag.docker.tar:$name:$tag"
fi
if [ -n "$push" ]; then
  echo "==> push docker://$push"
  tls_verify=true
  $insecure && tls_verify=false
  skopeo copy --quiet --dest-tls-verify="$tls_verify" "oci:$layout:$tag" "docker://$push"
fi

manifest_digest=$(skopeo inspect --raw "oci:$layout:$tag" | sha256sum | awk '{print "sha256:" $1}')
layers_bytes=$(skopeo inspect --raw "oci:$layout:$tag" | tr ',' '\n' | sed -n 's/.*"size": *\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s}')
rootfs_bytes=$(du -sb "$rootfs" | awk '{print $1}')
echo "image:    $name:$tag ($manifest_digest)"
echo "layout:   $layout (tag $tag)"
echo "archive:  $archive"
echo "size:     $layers_bytes bytes compressed (config + layers), $rootfs_bytes bytes unpacked"
