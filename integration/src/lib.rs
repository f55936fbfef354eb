//! Test harness for end-to-end tests: private registry, containerd, the weenv daemons and
//! test images, all under temp dirs on free loopback ports, torn down on drop.
//!
//! - [`util`]: free ports, binaries, root checks, process guards.
//! - [`registry`]: a private `docker-registry` (and a counting proxy).
//! - [`images`]: test images built offline (busybox-static, Debian via debootstrap).
//! - [`containerd`]: a private containerd with the weenv proxy snapshotter and shim.
//! - [`daemon`]: a `weenv-snapshotter` under a temp root, its config typed (the daemon's own
//!   `Config`), restartable; the `weenv` CLI against it.
//! - [`stack`]: registry + daemon + containerd in one builder ([`stack::Stack`]).
//! - [`convert`]: the registry client and converter as the tests call them.
//! - [`cri`]: containerd's CRI plugin settings and a CRI client (the kubelet's calls).
//! - [`gotools`]: containerd 2.x, runc, nerdctl, crictl, critest and CNI plugins built by
//!   `scripts/go-tools.sh`.
//! - [`cluster`]: K nodes in network namespaces (own containerd + snapshotter each) and a
//!   registry behind an HTB-shaped link, for the peer cache.
//! - [`debian_go`]: Go test programs built offline against Debian's containerd 1.6 sources.
//! - [`stockrun`]: containerd's Go client making nerdctl's calls (built from `go/stockrun`).
//! - [`snapconform`]: containerd's snapshotter conformance suite, overlayfs vs weenv (`go/snapconform`).
//! - [`untrusted_resources`]: images that try to exhaust the daemon's disk and memory.
//! - [`untrusted_tocbind`]: weenv images whose TOC lies about the tar in the same blob.

pub mod clients;
pub mod cluster;
pub mod containerd;
pub mod convert;
pub mod cri;
pub mod critest;
pub mod daemon;
pub mod debian_go;
pub mod gotools;
pub mod images;
pub mod registry;
pub mod snapconform;
pub mod stack;
pub mod stockrun;
pub mod untrusted_resources;
pub mod untrusted_tocbind;
pub mod util;
