// Package snapconform runs containerd's own snapshotter conformance suite
// (github.com/containerd/containerd/snapshots/testsuite, containerd 1.6 from Debian's
// golang-github-containerd-containerd-dev) against two snapshotters in one test binary:
//
//   - overlayfs: containerd's overlayfs snapshotter, in process (the control);
//   - weenv: a weenv-snapshotter daemon per subtest (root_dir = the suite's root), reached
//     through the Snapshots gRPC API with containerd's own proxy client (snapshots/proxy), as
//     containerd's proxy_plugins reach it. The daemon runs under the umask of -weenv-umask.
//
// Besides the suite, each snapshotter gets two checks of its own:
//
//   - ParentOwner: a committed snapshot whose root is chowned to 1000:1000 gives a child
//     snapshot (and a grandchild) whose root has that owner (containerd's user-namespace
//     support, WithRemappedSnapshot, relies on it);
//   - StateModes: the modes of the state directories (root, snapshots/, a snapshot's fs and
//     work; for weenv also tocs/, the cache and the FUSE mountpoints) under the process umask
//     the suite sets (000).
//
// Build (GOPATH mode, offline): see integration/src/snapconform.rs. Run with -test.v; the
// Rust test (integration/tests/snapshotter_conformance.rs) parses the "--- PASS/FAIL/SKIP"
// lines.
package snapconform

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/defaults"
	"github.com/containerd/containerd/log/logtest"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/dialer"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/containerd/snapshots/overlay"
	"github.com/containerd/containerd/snapshots/proxy"
	"github.com/containerd/containerd/snapshots/testsuite"
	"google.golang.org/grpc"
)

var (
	weenvBin   = flag.String("weenv-bin", "", "weenv-snapshotter binary (empty: weenv is not tested)")
	weenvUmask = flag.String("weenv-umask", "000,022", "umasks to run the weenv daemon under (comma-separated)")
	only       = flag.String("only", "overlayfs,weenv", "snapshotters to test")
)

func overlayFn(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
	sn, err := overlay.NewSnapshotter(root)
	if err != nil {
		return nil, nil, err
	}
	return sn, sn.Close, nil
}

// weenvFn starts a weenv-snapshotter daemon on root (its config, socket and log beside root,
// inside the suite's temp dir) under umask, and returns containerd's proxy client over it.
func weenvFn(umask string) testsuite.SnapshotterFunc {
	return func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		sock := root + "-weenv.sock"
		cfgPath := root + "-weenv.toml"
		logPath := root + "-weenv.log"
		cfg := fmt.Sprintf(`version = 1
root_dir = %q
socket = %q
log_level = "warn"
[registry]
containerd_socket = ""
[fill]
enabled = false
[fuse]
handover = false
threads = 1
[observability]
listen = ""
`, root, sock)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0600); err != nil {
			return nil, nil, err
		}
		logf, err := os.Create(logPath)
		if err != nil {
			return nil, nil, err
		}
		// The daemon's umask is set in a shell before exec (the suite clears this process's).
		cmd := exec.Command("/bin/sh", "-c", `umask "$1"; exec "$2" -c "$3"`, "sh", umask, *weenvBin, cfgPath)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, nil, err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait(); logf.Close() }()
		logTail := func() string {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			return string(b)
		}
		stop := func() error {
			select {
			case err := <-exited:
				return fmt.Errorf("weenv daemon exited early: %v\n%s", err, logTail())
			default:
			}
			// SIGINT: the daemon unmounts its FUSE session and exits.
			_ = cmd.Process.Signal(syscall.SIGINT)
			select {
			case err := <-exited:
				if err != nil {
					return fmt.Errorf("weenv daemon: %v\n%s", err, logTail())
				}
				return nil
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				return fmt.Errorf("weenv daemon did not stop in 30 s\n%s", logTail())
			}
		}
		// Dialled as containerd dials a proxy plugin (services/server: proxyClients.getClient).
		conn, err := grpc.Dial(dialer.DialAddress(sock),
			grpc.WithInsecure(),
			grpc.WithContextDialer(dialer.ContextDialer),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(defaults.DefaultMaxRecvMsgSize)),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(defaults.DefaultMaxSendMsgSize)),
		)
		if err != nil {
			_ = stop()
			return nil, nil, err
		}
		sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "weenv")
		deadline := time.Now().Add(60 * time.Second)
		for {
			// Ready once the daemon answers the Snapshots API (it serves after mounting).
			werr := sn.Walk(ctx, func(context.Context, snapshots.Info) error { return nil })
			if werr == nil {
				break
			}
			select {
			case err := <-exited:
				conn.Close()
				return nil, nil, fmt.Errorf("weenv daemon exited at start: %v\n%s", err, logTail())
			default:
			}
			if time.Now().After(deadline) {
				conn.Close()
				_ = stop()
				return nil, nil, fmt.Errorf("weenv daemon not serving after 60 s: %v\n%s", werr, logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
		return sn, func() error {
			conn.Close()
			return stop()
		}, nil
	}
}

func TestSnapshotters(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("the conformance suite needs root (mounts)")
	}
	type target struct {
		name  string
		fn    testsuite.SnapshotterFunc
		extra []string
	}
	var targets []target
	for _, s := range strings.Split(*only, ",") {
		switch s {
		case "overlayfs":
			targets = append(targets, target{"overlayfs", overlayFn, nil})
		case "weenv":
			if *weenvBin == "" {
				t.Fatal("-weenv-bin is required to test weenv")
			}
			for _, u := range strings.Split(*weenvUmask, ",") {
				targets = append(targets, target{"weenv-umask" + u, weenvFn(u), []string{"tocs", "cache", "mnt", "mnt-plain"}})
			}
		default:
			t.Fatalf("unknown snapshotter %q", s)
		}
	}
	for _, tg := range targets {
		tg := tg
		t.Run(tg.name, func(t *testing.T) {
			testsuite.SnapshotterSuite(t, tg.name, tg.fn)
			t.Run("ParentOwner", own(tg.fn, checkParentOwner))
			t.Run("StateModes", own(tg.fn, func(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, root, work string) {
				checkStateModes(ctx, t, sn, root, work, tg.extra)
			}))
		})
	}
}

// own runs check like the suite runs its tests (namespace "testsuite", a fresh snapshotter on a
// root inside a temp dir), except that the root does not exist before the snapshotter makes it.
func own(fn testsuite.SnapshotterFunc, check func(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, root, work string)) func(t *testing.T) {
	return func(t *testing.T) {
		old := syscall.Umask(0)
		defer syscall.Umask(old)
		ctx := namespaces.WithNamespace(logtest.WithT(context.Background(), t), "testsuite")
		tmp, err := os.MkdirTemp("", "snapconform-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		root := filepath.Join(tmp, "root")
		work := filepath.Join(tmp, "work")
		if err := os.MkdirAll(work, 0777); err != nil {
			t.Fatal(err)
		}
		sn, cleanup, err := fn(ctx, root)
		if err != nil {
			t.Fatalf("starting the snapshotter: %v", err)
		}
		defer func() {
			if err := cleanup(); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}()
		check(ctx, t, sn, root, work)
	}
}

var gcRoot = snapshots.WithLabels(map[string]string{"containerd.io/gc.root": "snapconform"})

// mountAt mounts m at a new directory under work; returns it and its unmount.
func mountAt(t *testing.T, m []mount.Mount, work, name string) (string, func()) {
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0777); err != nil {
		t.Fatal(err)
	}
	if err := mount.All(m, dir); err != nil {
		t.Fatalf("mounting %s: %v", name, err)
	}
	return dir, func() {
		if err := mount.UnmountAll(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	}
}

func ownerOf(t *testing.T, p string) (uint32, uint32, os.FileMode) {
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	s := st.Sys().(*syscall.Stat_t)
	return s.Uid, s.Gid, st.Mode().Perm()
}

// checkParentOwner: the root of a new snapshot has its parent's owner (overlayfs chowns a new
// snapshot's fs to the owner of its parent's), in a child and a grandchild, active and view.
func checkParentOwner(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, root, work string) {
	m, err := sn.Prepare(ctx, "base-a", "", gcRoot)
	if err != nil {
		t.Fatal(err)
	}
	dir, umount := mountAt(t, m, work, "base")
	if err := os.Chown(dir, 1000, 1001); err != nil {
		t.Fatal(err)
	}
	umount()
	if err := sn.Commit(ctx, "base", "base-a", gcRoot); err != nil {
		t.Fatal(err)
	}
	check := func(key, parent string, view bool) {
		var m []mount.Mount
		var err error
		if view {
			m, err = sn.View(ctx, key, parent, gcRoot)
		} else {
			m, err = sn.Prepare(ctx, key, parent, gcRoot)
		}
		if err != nil {
			t.Fatal(err)
		}
		dir, umount := mountAt(t, m, work, key)
		defer umount()
		uid, gid, mode := ownerOf(t, dir)
		t.Logf("%s: %s (parent %s): root %d:%d %04o", t.Name(), key, parent, uid, gid, mode)
		if uid != 1000 || gid != 1001 {
			t.Errorf("%s: root owned by %d:%d, want the parent's 1000:1001", key, uid, gid)
		}
	}
	check("child-view", "base", true)
	check("child-a", "base", false)
	if err := sn.Commit(ctx, "child", "child-a", gcRoot); err != nil {
		t.Fatal(err)
	}
	check("grandchild", "child", false)
}

// checkStateModes: state directories are private to root and a snapshot's dirs have
// overlayfs's modes, whatever the umask (the suite runs with umask 000).
func checkStateModes(ctx context.Context, t *testing.T, sn snapshots.Snapshotter, root, work string, extra []string) {
	if _, err := sn.Prepare(ctx, "c-a", "", gcRoot); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "c", "c-a", gcRoot); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "a", "c", gcRoot); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.View(ctx, "v", "c", gcRoot); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{".": 0700, "snapshots": 0700}
	for _, e := range extra {
		want[e] = 0700
	}
	ids, err := os.ReadDir(filepath.Join(root, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		want[filepath.Join("snapshots", id.Name())] = 0 // reported, not checked
		want[filepath.Join("snapshots", id.Name(), "fs")] = 0755
		if _, err := os.Stat(filepath.Join(root, "snapshots", id.Name(), "work")); err == nil {
			want[filepath.Join("snapshots", id.Name(), "work")] = 0711
		}
	}
	for rel, w := range want {
		p := filepath.Join(root, rel)
		st, err := os.Stat(p)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		got := st.Mode().Perm()
		t.Logf("%s: mode %s %04o", t.Name(), rel, got)
		if w != 0 && got != w {
			t.Errorf("%s: mode %04o, want %04o", rel, got, w)
		}
	}
}
