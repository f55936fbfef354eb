#!/usr/bin/env bash
# Builds the pinned Go tools the end-to-end tests drive: containerd 2.x (and 1.7), runc, nerdctl,
# cri-tools (crictl, critest) and the CNI plugins, with Go >= 1.26 through the Go module proxy.
# Each tool is built once per version into $WEENV_GO_TOOLS/<name>-<version>/ (default
# /var/tmp/weenv-go-tools) and reused after that; a `.done` file marks a complete build.
#
#   scripts/go-tools.sh            # build what is missing, print the bin directories
#   scripts/go-tools.sh --list     # print "name version dir" of every pinned tool, build nothing
#   WEENV_GO_TOOLS_ONLY="containerd2 crictl" scripts/go-tools.sh   # a subset
#   WEENV_GO_TOOLS_ALL=1 scripts/go-tools.sh    # also the optional ones (none at present)
#
# The integration harness (integration/src/gotools.rs) finds the binaries under the same
# directories. Source comes from the module proxy (`go mod download`), is copied to a scratch
# dir and built with `go build` there: `go install pkg@version` refuses modules whose go.mod has
# replace directives (nerdctl's does).
set -euo pipefail

WEENV_GO_TOOLS="${WEENV_GO_TOOLS:-/var/tmp/weenv-go-tools}"
GO="${WEENV_GO:-}"
if [ -z "$GO" ]; then
  for g in /usr/local/go/bin/go "$(command -v go || true)"; do
    [ -x "$g" ] || continue
    if "$g" version | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then GO=$g; break; fi
  done
fi

# name          module                                   version   packages (dir=output name)
TOOLS=(
  "containerd2  github.com/containerd/containerd/v2      v2.4.2    cmd/containerd cmd/ctr cmd/containerd-shim-runc-v2"
  "runc         github.com/opencontainers/runc           v1.5.3    ."
  "nerdctl      github.com/containerd/nerdctl/v2         v2.4.2    cmd/nerdctl"
  "crictl       sigs.k8s.io/cri-tools                    v1.37.0   cmd/crictl"
  "critest      sigs.k8s.io/cri-tools                    v1.37.0   cmd/critest"
  "cni          github.com/containernetworking/plugins   v1.10.0   plugins/main/bridge plugins/main/loopback plugins/ipam/host-local plugins/meta/portmap"
  "containerd17 github.com/containerd/containerd         v1.7.35   cmd/containerd"
)
# Built only with WEENV_GO_TOOLS_ALL=1 or when named in WEENV_GO_TOOLS_ONLY (none at present:
# containerd 1.7 is built by default, `plans_by_reference` runs on it; it shares most modules
# with containerd 2.x, ~100 s of CPU after it).
OPTIONAL=""

tool_dir() { echo "$WEENV_GO_TOOLS/$1-$2"; }

if [ "${1:-}" = "--list" ]; then
  for t in "${TOOLS[@]}"; do
    read -r name module version _ <<<"$t"
    echo "$name $version $(tool_dir "$name" "$version")"
  done
  exit 0
fi

if [ -z "$GO" ]; then
  echo "go-tools.sh: needs Go >= 1.26 (looked at /usr/local/go/bin/go and PATH); set WEENV_GO" >&2
  exit 1
fi

build_tool() {
  local name=$1 module=$2 version=$3; shift 3
  local out; out=$(tool_dir "$name" "$version")
  if [ -f "$out/.done" ]; then echo "go-tools: $name $version cached in $out"; return 0; fi
  local t0=$SECONDS src scratch tags=() cgo=1
  echo "go-tools: building $name $version ($module)"
  src=$("$GO" mod download -json "$module@$version" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
  [ -d "$src" ] || { echo "go-tools: $module@$version: no source from the module proxy" >&2; return 1; }
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/weenv-go-build.XXXXXX")
  cp -a "$src/." "$scratch/"
  chmod -R u+w "$scratch"
  case $name in
    containerd2|containerd17) tags=(-tags "no_btrfs urfave_cli_no_docs") ;;
    runc) tags=(-tags "seccomp urfave_cli_no_docs") ;;
    cni) cgo=0 ;;
  esac
  # nerdctl's go.mod replaces its test helper module with ./mod/tigron, which the module zip
  # does not carry; only tests import it, so an empty module there satisfies the build list.
  if [ "$name" = nerdctl ] && [ ! -f "$scratch/mod/tigron/go.mod" ]; then
    mkdir -p "$scratch/mod/tigron"
    printf 'module github.com/containerd/nerdctl/mod/tigron\n\ngo 1.24\n' >"$scratch/mod/tigron/go.mod"
  fi
  # nerdctl v2.4.2 pins github.com/moby/moby/v2 v2.0.0-beta.28, which the module proxy does
  # not serve (403 "not available"); beta.25, the newest it serves, has the same pkg/sysinfo
  # and pkg/meminfo that nerdctl's infoutil imports.
  if [ "$name" = nerdctl ]; then
    (cd "$scratch" && "$GO" mod edit -replace github.com/moby/moby/v2=github.com/moby/moby/v2@v2.0.0-beta.25)
  fi
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  local pkg bin
  for pkg in "$@"; do
    bin=$(basename "$pkg"); [ "$pkg" = . ] && bin=$name
    if [ "$name" = critest ]; then
      # critest is a ginkgo suite compiled as a test binary (as cri-tools' Makefile does).
      (cd "$scratch" && CGO_ENABLED=0 nice "$GO" test -c -trimpath -mod=mod -ldflags "-s -w" -o "$out.tmp/critest" "./$pkg")
    else
      (cd "$scratch" && CGO_ENABLED=$cgo nice "$GO" build -trimpath -mod=mod "${tags[@]}" \
        -ldflags "-s -w" -o "$out.tmp/$bin" "./$pkg")
    fi
  done
  rm -rf "$scratch"
  echo "$module $version built in $((SECONDS - t0))s by $("$GO" version)" >"$out.tmp/.done"
  rm -rf "$out"; mv "$out.tmp" "$out"
  echo "go-tools: $name $version built in $((SECONDS - t0))s -> $out"
}

mkdir -p "$WEENV_GO_TOOLS"
# The compile cache sits next to the tools, so a version bump of one tool recompiles only what
# changed (containerd's, runc's and nerdctl's shared dependencies are compiled once).
export GOCACHE="${GOCACHE:-$WEENV_GO_TOOLS/.gocache}"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
t_all=$SECONDS
for t in "${TOOLS[@]}"; do
  read -r name module version pkgs <<<"$t"
  if [ -n "${WEENV_GO_TOOLS_ONLY:-}" ]; then
    grep -qw "$name" <<<"$WEENV_GO_TOOLS_ONLY" || continue
  elif grep -qw "$name" <<<"$OPTIONAL" && [ -z "${WEENV_GO_TOOLS_ALL:-}" ]; then
    continue
  fi
  # shellcheck disable=SC2086
  build_tool "$name" "$module" "$version" $pkgs
done
echo "go-tools: all tools ready in $((SECONDS - t_all))s under $WEENV_GO_TOOLS"
