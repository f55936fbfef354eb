// stockrun makes exactly the calls nerdctl makes to pull and run an image with a snapshotter,
// through containerd's Go client (Debian golang-github-containerd-containerd-dev, GOPATH mode):
//
//	client.Pull(ctx, ref, WithPullUnpack, WithPullSnapshotter(sn), WithResolver(...))
//	client.NewContainer(ctx, id, WithImage, WithSnapshotter, WithNewSnapshot, WithNewSpec(oci.WithImageConfig, ...))
//	  (with -remap N: WithRemappedSnapshot(id, img, N, N) and oci.WithUserNamespace(0 -> N, 65536 ids))
//	container.NewTask(ctx, cio.NewCreator(WithStreams(...))); task.Wait; task.Start; <-exit
//
// No weenv code and no snapshot labels of its own: whatever is lazy is lazy because the
// image's layer annotations and the snapshotter make it so. It forwards the container's output
// and prints one JSON line to stderr, prefixed "stockrun: " ({"pull_secs", "first_output_secs",
// "total_secs", "exit_code"}), then exits with the container's exit code (125 for its own
// failures).
//
// Build: GO111MODULE=off GOPATH=$tmp:/usr/share/gocode go build -o $tmp/stockrun ./integration/go/stockrun
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes/docker"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// firstWrite forwards writes and records when the first byte came.
type firstWrite struct {
	w     io.Writer
	start time.Time
	once  sync.Once
	first time.Duration
	mu    sync.Mutex
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() {
			f.mu.Lock()
			f.first = time.Since(f.start)
			f.mu.Unlock()
		})
	}
	return f.w.Write(p)
}

func (f *firstWrite) seconds() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first.Seconds()
}

type report struct {
	PullSecs        float64 `json:"pull_secs"`
	FirstOutputSecs float64 `json:"first_output_secs"`
	TotalSecs       float64 `json:"total_secs"`
	ExitCode        uint32  `json:"exit_code"`
}

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "stockrun: %s: %v\n", step, err)
	os.Exit(125)
}

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd socket")
	ns := flag.String("namespace", "default", "containerd namespace")
	snapshotter := flag.String("snapshotter", "weenv", "snapshotter")
	runtime := flag.String("runtime", "", "runtime (default: containerd's default)")
	plainHTTP := flag.Bool("plain-http", false, "talk to every registry over plain HTTP")
	id := flag.String("id", fmt.Sprintf("stockrun-%d", time.Now().UnixNano()), "container id")
	remap := flag.Uint("remap", 0, "run in a user namespace mapping container ids 0-65535 to host ids N-N+65535, on a snapshot chowned by containerd's WithRemappedSnapshot (0: no user namespace)")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: stockrun [flags] REF [ARGS...]")
		os.Exit(125)
	}
	ref, args := flag.Arg(0), flag.Args()[1:]
	start := time.Now()
	ctx := namespaces.WithNamespace(context.Background(), *ns)

	client, err := containerd.New(*address)
	if err != nil {
		fail("connect", err)
	}
	defer client.Close()

	hostOpts := []docker.RegistryOpt{}
	if *plainHTTP {
		hostOpts = append(hostOpts, docker.WithPlainHTTP(func(string) (bool, error) { return true, nil }))
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(hostOpts...)})
	img, err := client.Pull(ctx, ref,
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(*snapshotter),
		containerd.WithResolver(resolver),
	)
	if err != nil {
		fail("pull", err)
	}
	pulled := time.Since(start)

	specOpts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(args) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(args...))
	}
	snapshot := containerd.WithNewSnapshot(*id+"-snapshot", img)
	if *remap > 0 {
		// What a user-namespaced container of containerd's Go client is (ctr run --remap-labels
		// in later releases): ids mapped in the runtime spec, a snapshot whose every file
		// containerd chowned by N (and whose child, the container's, keeps that root owner).
		n := uint32(*remap)
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: n, Size: 65536}}
		specOpts = append(specOpts, oci.WithUserNamespace(m, m))
		snapshot = containerd.WithRemappedSnapshot(*id+"-snapshot", img, n, n)
	}
	copts := []containerd.NewContainerOpts{
		containerd.WithImage(img),
		containerd.WithSnapshotter(*snapshotter),
		snapshot,
		containerd.WithNewSpec(specOpts...),
	}
	if *runtime != "" {
		copts = append(copts, containerd.WithRuntime(*runtime, nil))
	}
	container, err := client.NewContainer(ctx, *id, copts...)
	if err != nil {
		fail("new container", err)
	}
	defer container.Delete(ctx, containerd.WithSnapshotCleanup)

	out := &firstWrite{w: os.Stdout, start: start}
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, out, os.Stderr)))
	if err != nil {
		fail("new task", err)
	}
	defer task.Delete(ctx)
	exitC, err := task.Wait(ctx)
	if err != nil {
		fail("wait", err)
	}
	if err := task.Start(ctx); err != nil {
		fail("start", err)
	}
	status := <-exitC
	code, _, err := status.Result()
	if err != nil {
		fail("exit status", err)
	}
	// Let the copy of the output finish before reading the first-output time.
	if t, err := task.Delete(ctx); err == nil && t != nil {
		code = t.ExitCode()
	}
	r := report{
		PullSecs:        pulled.Seconds(),
		FirstOutputSecs: out.seconds(),
		TotalSecs:       time.Since(start).Seconds(),
		ExitCode:        code,
	}
	b, _ := json.Marshal(r)
	fmt.Fprintf(os.Stderr, "stockrun: %s\n", strings.TrimSpace(string(b)))
	container.Delete(ctx, containerd.WithSnapshotCleanup)
	os.Exit(int(code))
}
