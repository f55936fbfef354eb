#!/usr/bin/env bash
# A small Debian VM with cgroup v2 only, for the shim's end-to-end tests on the hierarchy
# current clusters run (this development machine binds cpu/memory to cgroup v1).
#
#   scripts/vm-cgroup2.sh build                       # build the image if not cached
#   scripts/vm-cgroup2.sh run [opts] [--] CMD...      # boot, run CMD as root, power off
#     --copy SRC[:NAME]   copy a file or directory to /payload/NAME in the VM (repeatable)
#     --out DIR           copy what CMD wrote to /payload/out back to DIR
#     --cgroup v1|v2      hierarchy the VM boots with (default v2; v1 for comparisons)
#     --cpus N --mem MiB  vCPUs (default 2) and memory (default 2048)
#     --timeout S         power off (kill qemu) after S seconds (default 1200)
#   scripts/vm-cgroup2.sh clean                       # remove cached images of old recipes
#
# Recipe: Debian bookworm's `linux-image-cloud-amd64` kernel (its storage driver NVMe is
# built in, so no initramfs is needed), a root filesystem built offline with debootstrap
# (containerd, runc, umoci, busybox-static, tini, kmod) and written into an ext4 image with
# `mke2fs -d` (no mount, no loop device), cached under $WEENV_VM_CACHE (default
# /var/tmp/weenv-vm/<recipe hash>). The root disk is attached with `snapshot=on`: every run
# starts from the pristine image and its writes vanish with the VM. A second disk holds the
# payload (the files given with --copy, CMD as run.sh) and comes back with CMD's results
# (read with debugfs, again without mounting). PID 1 is a shell script that mounts proc,
# sys, dev, a cgroup2 tree with `+cpu +memory +pids` in cgroup.subtree_control (or the v1
# controllers with --cgroup v1), then runs CMD under tini (reaps the shims' orphans) and
# powers off. No KVM is used (this machine offers none that works): qemu's TCG emulates
# the CPU, ~10x slower; the guest clock follows the host's, so timings inside are real time.
# The script's exit status is CMD's. Nothing is left running: qemu is this script's child,
# killed on timeout, error or interrupt; its temp files are removed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
RECIPE_VERSION=1
PACKAGES=containerd,runc,umoci,busybox-static,tini,kmod
SUITE=bookworm
KERNEL_META=linux-image-cloud-amd64
# The cache key covers everything that shapes the image: this file's recipe functions.
recipe_key() {
  { echo "$RECIPE_VERSION $PACKAGES $SUITE $KERNEL_META"; declare -f build_image guest_init guest_run; } |
    sha256sum | cut -c1-16
}
CACHE_ROOT=${WEENV_VM_CACHE:-/var/tmp/weenv-vm}

log() { echo "vm-cgroup2: $*" >&2; }
die() { log "$*"; exit 2; }

need() {
  local b
  for b in "$@"; do command -v "$b" >/dev/null || die "$b missing: run scripts/deps.sh"; done
}

debian_mirror() {
  # The first bookworm mirror of the apt sources (one-line or deb822 format).
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v s="$SUITE" '
      /^deb / && $0 ~ (" " s "( |$)") { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }
      /^URIs:/ { u = $2 } /^Suites:/ && $0 ~ (" " s "( |$)") && u != "" && u !~ /security/ { print u; exit }
    ' "$f"
  done | head -n1
}

# PID 1 of the VM (written into the image).
guest_init() {
  cat <<'EOF'
#!/bin/sh
# weenv VM init: mounts, cgroup tree, payload disk, then the command under tini.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=755 run /run
mount -o remount,rw /
hostname weenv-vm
busybox ip link set lo up
mode=v2
for a in $(cat /proc/cmdline); do case $a in weenv.cgroup=*) mode=${a#weenv.cgroup=} ;; esac; done
if [ "$mode" = v1 ]; then
  mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
  for c in cpu,cpuacct memory pids cpuset devices freezer blkio; do
    mkdir -p "/sys/fs/cgroup/$c" && mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
  done
  ln -s cpu,cpuacct /sys/fs/cgroup/cpu && ln -s cpu,cpuacct /sys/fs/cgroup/cpuacct
  echo 1 > /sys/fs/cgroup/memory/memory.use_hierarchy 2>/dev/null
else
  mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
  echo "+cpu +memory +pids +cpuset +io" > /sys/fs/cgroup/cgroup.subtree_control
fi
modprobe overlay
mkdir -p /payload && mount /dev/nvme0n2 /payload
exec /usr/bin/tini -s -- /sbin/weenv-vm-run
EOF
}

# Runs the payload's command and powers off (tini's child).
guest_run() {
  cat <<'EOF'
#!/bin/sh
cd /payload
mkdir -p out
echo "weenv-vm: $(uname -r), cgroup $(stat -fc %T /sys/fs/cgroup), $(nproc) vCPU, up $(cut -d' ' -f1 /proc/uptime) s: running run.sh"
sh /payload/run.sh </dev/null
rc=$?
echo "$rc" > out/rc
echo "weenv-vm: exit status $rc at uptime $(cut -d' ' -f1 /proc/uptime) s"
cd /
sync
umount /payload
busybox poweroff -f
EOF
}

build_image() {
  # $1: final cache dir (created atomically from a temp dir beside it).
  local dest=$1 tmp mirror meta pkg kver
  need debootstrap dpkg-deb mke2fs apt-get apt-cache
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || die "no $SUITE mirror in the apt sources"
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  log "building the image in $tmp (debootstrap $SUITE from $mirror)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  # The kernel: the versioned package the meta package points to, unpacked into the image.
  pkg=$(apt-cache depends "$KERNEL_META" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$pkg" ]; then apt-get update -q >/dev/null; pkg=$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'); fi
  [ -n "$pkg" ] || die "cannot resolve $KERNEL_META to a kernel package"
  (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
  # Unpacked beside the image, not into it: dpkg-deb -x would replace the merged-/usr
  # symlink /lib with a directory.
  dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/kernel-deb"
  kver=${pkg#linux-image-}
  mkdir -p "$tmp/rootfs/usr/lib/modules"
  cp -a "$tmp/kernel-deb/lib/modules/$kver" "$tmp/rootfs/usr/lib/modules/"
  chroot "$tmp/rootfs" /usr/sbin/depmod "$kver"
  cp "$tmp/kernel-deb/boot/vmlinuz-$kver" "$tmp/vmlinuz"
  rm -rf "$tmp/kernel-deb" "$tmp"/"$pkg"_*.deb
  guest_init >"$tmp/rootfs/sbin/weenv-vm-init"
  guest_run >"$tmp/rootfs/sbin/weenv-vm-run"
  chmod 755 "$tmp/rootfs/sbin/weenv-vm-init" "$tmp/rootfs/sbin/weenv-vm-run"
  rm -rf "$tmp/rootfs/var/cache/apt/"*.bin "$tmp/rootfs/var/lib/apt/lists/"*
  echo "$pkg $(date -u +%FT%TZ)" >"$tmp/rootfs/etc/weenv-vm"
  # Sparse 4 GiB: room for containerd's content and snapshots during a run.
  mke2fs -q -t ext4 -L weenv-root -E root_owner=0:0 -d "$tmp/rootfs" -F "$tmp/root.img" 4G >/dev/null
  rm -rf "$tmp/rootfs"
  echo "$pkg" >"$tmp/kernel"
  mv "$tmp" "$dest.new" && mv "$dest.new" "$dest"
  trap - RETURN
}

image_dir() {
  local dir t0
  dir="$CACHE_ROOT/$(recipe_key)"
  if [ ! -f "$dir/root.img" ]; then
    t0=$SECONDS
    mkdir -p "$CACHE_ROOT"
    exec 9>"$CACHE_ROOT/.lock"
    flock 9
    [ -f "$dir/root.img" ] || { build_image "$dir"; log "image built in $((SECONDS - t0)) s: $dir"; }
    exec 9>&-
  fi
  echo "$dir"
}

cmd_run() {
  local copies=() out="" mode=v2 cpus=2 mem=2048 timeout=1200 img run a src name size qpid rc t0 deadline
  while [ $# -gt 0 ]; do
    case $1 in
      --copy) copies+=("$2"); shift 2 ;;
      --out) out=$2; shift 2 ;;
      --cgroup) mode=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --mem) mem=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --) shift; break ;;
      -*) die "unknown option $1" ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || die "run: no command"
  case $mode in v1|v2) ;; *) die "--cgroup must be v1 or v2" ;; esac
  need qemu-system-x86_64 mke2fs debugfs
  img=$(image_dir)
  run=$(mktemp -d "${TMPDIR:-/tmp}/weenv-vm-run.XXXXXX")
  qpid=""
  # shellcheck disable=SC2064
  trap "rc=\$?; [ -n \"\$qpid\" ] && kill -KILL \$qpid 2>/dev/null; wait 2>/dev/null; rm -rf '$run'; exit \$rc" EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$run/payload/out"
  for a in "${copies[@]}"; do
    src=${a%%:*}; name=${a#*:}; [ "$name" = "$a" ] && name=$(basename "$src")
    mkdir -p "$run/payload/$(dirname "$name")"
    cp -a "$src" "$run/payload/$name"
  done
  printf '%q ' "$@" >"$run/payload/run.sh"; echo >>"$run/payload/run.sh"
  size=$(( $(du -sm "$run/payload" | cut -f1) + 256 ))
  mke2fs -q -t ext4 -L weenv-payload -d "$run/payload" -F "$run/payload.img" "${size}M" >/dev/null
  local cg_args="weenv.cgroup=$mode"
  [ "$mode" = v2 ] && cg_args="$cg_args cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1"
  t0=$SECONDS
  # qemu's snapshot=on overlay goes to TMPDIR: keep it in the run dir.
  TMPDIR=$run qemu-system-x86_64 -accel tcg,thread=multi -smp "$cpus" -m "$mem" \
    -nodefaults -display none -no-reboot -nic none \
    -serial "file:$run/console.log" \
    -kernel "$img/vmlinuz" \
    -append "console=ttyS0 root=/dev/nvme0n1 rw rootwait init=/sbin/weenv-vm-init quiet loglevel=3 panic=-1 $cg_args" \
    -drive "file=$img/root.img,if=none,id=root,format=raw,snapshot=on" \
    -drive "file=$run/payload.img,if=none,id=payload,format=raw" \
    -device nvme,id=nvme0,serial=weenv0 \
    -device nvme-ns,drive=root,bus=nvme0,nsid=1 \
    -device nvme-ns,drive=payload,bus=nvme0,nsid=2 &
  qpid=$!
  touch "$run/console.log"
  tail -n +1 -f --pid="$qpid" "$run/console.log" &
  deadline=$((SECONDS + timeout))
  while kill -0 "$qpid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      log "timeout after $timeout s: stopping the VM"
      kill -KILL "$qpid" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$qpid" 2>/dev/null || true
  qpid=""
  sleep 0.2  # let tail print the last lines
  rc=$(debugfs -R "cat /out/rc" "$run/payload.img" 2>/dev/null | tr -dc 0-9)
  if [ -n "$out" ]; then
    mkdir -p "$out" "$run/dump"
    debugfs -R "rdump /out $run/dump" "$run/payload.img" >/dev/null 2>&1 || log "could not copy /payload/out to $out"
    cp -a "$run/dump/out/." "$out/" 2>/dev/null || true
    cp "$run/console.log" "$out/console.log"
  fi
  log "VM ran $((SECONDS - t0)) s (cgroup $mode, $cpus vCPU, TCG)"
  if [ -z "$rc" ]; then
    log "the command did not finish (no exit status): see the console above"
    exit 1
  fi
  exit "$rc"
}

case ${1:-} in
  build) image_dir >/dev/null; log "image: $(image_dir)" ;;
  run) shift; cmd_run "$@" ;;
  clean)
    keep=$(recipe_key)
    for d in "$CACHE_ROOT"/*/; do [ -d "$d" ] && [ "$(basename "$d")" != "$keep" ] && rm -rf "$d"; done
    log "kept $CACHE_ROOT/$keep" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
