package env

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"
)

// Containerd is a private containerd daemon.
type Containerd struct {
	// Address is its gRPC socket.
	Address string
	// Root and State are its directories.
	Root, State string
	// Version is the daemon's version.
	Version string
	// CgroupParent is the cgroup the agent that drives this containerd
	// is to give its pods (containerd.cgroupParent): a name of this
	// daemon's, so that a power cut and the cleanup kill and remove what
	// is in it, and nothing of another agent's.
	CgroupParent string

	dir, cfgPath, bin string
	// binDir, when set, is put first in the daemon's PATH: where the
	// runc shim of its version is.
	binDir string
	netns  string
	v1Only bool
	proc   *process
	// first are what StopFirst registered, run before the daemon's
	// cleanups.
	first []func()
	// shared is where TempDir makes directories when the daemon runs in
	// a mount namespace of its own: a shared mount it receives mounts
	// from; "" when it runs in the test's.
	shared string
}

// TempDir returns a new directory for a test's files, removed in t's
// cleanup, which this daemon, its shims and its OCI runtime see as the
// test does, mounts made in it later (a pod's tmpfs volumes) included.
// The daemon of StartContainerdV1Only on a hybrid host runs in a mount
// namespace of its own, a slave of the host's, which would receive no
// mount made under a test's own temp dir: the host's root is a private
// mount here. Its directories are under a shared mount of its own.
func (c *Containerd) TempDir(t testing.TB) string {
	t.Helper()
	if c.shared == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(c.shared, "t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// StopFirst has stop (an agent's, say) run before this daemon's cleanups
// remove its containers and stop it, however late it was started again
// (PowerCutThen, Restart): an agent still running then would see its
// containers go and start them again while the test ends.
func (c *Containerd) StopFirst(stop func()) { c.first = append(c.first, stop) }

// stopFirst runs what StopFirst registered, once.
func (c *Containerd) stopFirst() {
	first := c.first
	c.first = nil
	for _, stop := range first {
		stop()
	}
}

// CRIOptions turn on containerd's CRI plugin, for kubelet, in a
// containerd started by StartContainerdCRI.
type CRIOptions struct {
	// Netns is the network namespace (a path under /run/netns) the daemon
	// runs in: its CNI plugins make the pod network there.
	Netns string
	// CNIConfDir holds the CNI network configuration.
	CNIConfDir string
	// SandboxImage is the pod sandbox ("pause") image, imported already.
	SandboxImage string
}

// StartContainerd starts a containerd with its own socket, root and state
// under a temp dir, and stops it in t's cleanup after removing every task
// and container it holds, killing leftover shims and unmounting what it
// mounted.
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	return startContainerd(t, nil)
}

// StartContainerdV1Only starts a containerd as StartContainerd does; on a
// host that mounts a cgroup v2 hierarchy beside the v1 ones (a hybrid
// layout, as /sys/fs/cgroup/unified), the daemon, its shims and their
// OCI runtimes run in a mount namespace of their own without it. crun
// 1.8 (Debian 12) refuses a hybrid layout with any controller on v2, as
// this machine's hugetlb is, and changing which hierarchy a controller
// is on would change the host's. The namespace is a slave of the host's:
// mounts made later under a shared mount (the pods' netns pins under
// /run/netns, the daemon's TempDir) reach it, mounts under a private one
// do not.
func StartContainerdV1Only(t testing.TB) *Containerd {
	t.Helper()
	c := &Containerd{v1Only: true}
	return startContainerdAs(t, c, nil)
}

// HybridCgroups reports whether the host mounts a cgroup v2 hierarchy at
// /sys/fs/cgroup/unified beside v1 hierarchies.
func HybridCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// WithoutUnified reports whether the daemon, its shims and their OCI
// runtime run without the host's cgroup v2 hierarchy of a hybrid layout
// (StartContainerdV1Only on a hybrid host): the containers get no cgroup
// in /sys/fs/cgroup/unified.
func (c *Containerd) WithoutUnified() bool { return c.v1Only && HybridCgroups() }

// mountShared makes dir a shared mount of itself: mounts made under it
// reach the mount namespaces made after as slaves of the test's.
func mountShared(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// StartContainerdCRI starts a containerd as StartContainerd does, with its
// CRI plugin serving kubelet on the same socket, in the network namespace
// opts names. Images are imported with ImportTestImage and ImportImage
// into CRI's namespace, k8s.io.
func StartContainerdCRI(t testing.TB, opts CRIOptions) *Containerd {
	t.Helper()
	return startContainerd(t, &opts)
}

func startContainerd(t testing.TB, cri *CRIOptions) *Containerd {
	t.Helper()
	return startContainerdAs(t, &Containerd{}, cri)
}

// StartContainerd2 starts a containerd as StartContainerd does, of
// version 2 with its own runc shim (scripts/testenv/build-tools.sh builds
// them under ToolsDir()/containerd2), and skips t when they are not
// built.
func StartContainerd2(t testing.TB) *Containerd {
	t.Helper()
	RequireRoot(t)
	dir := filepath.Join(ToolsDir(), "containerd2", "bin")
	c := &Containerd{bin: filepath.Join(dir, "containerd"), binDir: dir}
	for _, name := range []string{"containerd", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Skipf("containerd 2 is not built in %s: run `make testenv` (as root): %v", dir, err)
		}
	}
	return startContainerdAs(t, c, nil)
}

func startContainerdAs(t testing.TB, c *Containerd, cri *CRIOptions) *Containerd {
	t.Helper()
	RequireRoot(t)
	bin := c.bin
	if bin == "" {
		bin = lookTool(t, "containerd")
	}
	// Unix socket paths are short (108 bytes): keep the dir near the root.
	dir, err := os.MkdirTemp("", "outpost-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c.Address = filepath.Join(dir, "containerd.sock")
	c.Root, c.State = filepath.Join(dir, "root"), filepath.Join(dir, "state")
	c.CgroupParent = "/" + filepath.Base(dir)
	c.dir, c.bin = dir, bin
	plugins := `disabled_plugins = ["io.containerd.grpc.v1.cri"]`
	if cri != nil {
		c.netns = cri.Netns
		plugins = fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  # kubelet asks for -998 for sandboxes; where lowering a score is
  # refused (this VM), runc create fails without this cap at containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # runc's state on the state tmpfs, as /run/containerd/runc is on
      # a real machine, and not in k8s.io's directory there, which
      # another containerd on this machine may use.
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q`, cri.SandboxImage, filepath.Join(c.State, "runc"), cri.CNIConfDir)
	}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
%s

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""
`, c.Root, c.State, plugins, c.Address, c.Address+".ttrpc")
	cfgPath := filepath.Join(dir, "config.toml")
	c.cfgPath = cfgPath
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.stopFirst()
		sockets := c.shimSockets()
		killByCmdline(c.Address) // shims name the daemon's socket
		removeShimSockets(sockets)
		killCgroup(c.CgroupParent)
		if err := unmountUnder(dir); err != nil {
			t.Errorf("containerd cleanup: %v", err)
		}
		os.RemoveAll(dir)
		RemoveCgroups(t, c.CgroupParent)
	})
	// The state directory is a tmpfs, as /run/containerd is on a real
	// machine: a power cut empties it without deleting its files one by
	// one from a disk (cleaned up with dir, above).
	if err := mountTmpfs(c.State); err != nil {
		t.Fatal(err)
	}
	if c.v1Only && HybridCgroups() {
		// Before the daemon's namespace is made, which copies it.
		c.shared = filepath.Join(dir, "shared")
		if err := mountShared(c.shared); err != nil {
			t.Fatal(err)
		}
	}
	client := c.start(t)
	// Registered after start, so it runs before the daemon is stopped.
	t.Cleanup(func() {
		c.stopFirst()
		if c.proc.exited() {
			return
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer removeShimSockets(c.shimSockets())
		if err := removeAll(ctx, client); err != nil {
			t.Logf("containerd cleanup: %v", err)
		}
	})
	return c
}

// start runs the daemon and waits until it answers.
func (c *Containerd) start(t testing.TB) *containerd.Client {
	t.Helper()
	args := []string{"env", "OUTPOST_SHIM_RECORDS=" + c.shimRecords(), c.bin, "--config", c.cfgPath, "--log-level", "warn"}
	if c.binDir != "" {
		args = append(args[:2:2], append([]string{"PATH=" + c.binDir + ":" + os.Getenv("PATH")}, args[2:]...)...)
	}
	if c.v1Only && HybridCgroups() {
		args = append([]string{"unshare", "--mount", "--propagation", "slave", "--",
			"sh", "-c", `umount /sys/fs/cgroup/unified && exec "$0" "$@"`}, args...)
	}
	if c.netns != "" {
		args = append([]string{"nsenter", "--net=" + c.netns}, args...)
	}
	p := start(t, c.dir, "containerd", args...)
	t.Cleanup(c.stopFirst) // before the daemon's process is killed
	c.proc = p
	var client *containerd.Client
	waitReady(t, p, 30*time.Second, func() error {
		if _, err := os.Stat(c.Address); err != nil {
			return err
		}
		cl, err := containerd.New(c.Address, containerd.WithTimeout(2*time.Second))
		if err != nil {
			return err
		}
		v, err := cl.Version(context.Background())
		if err != nil {
			cl.Close()
			return err
		}
		c.Version, client = v.Version, cl
		return nil
	})
	return client
}

// PowerCut simulates losing power: the daemon and every shim and
// container die at once with SIGKILL, and the state directory (a tmpfs,
// as on a real machine) is emptied; the root with images, snapshots and container
// records stays, as on disk. Then containerd starts again.
func (c *Containerd) PowerCut(t testing.TB) {
	t.Helper()
	c.PowerCutThen(t, nil)
}

// PowerCutThen is PowerCut with reboot, when not nil, called before
// containerd starts again: to wipe what else a reboot wipes.
func (c *Containerd) PowerCutThen(t testing.TB, reboot func()) {
	t.Helper()
	sockets := c.shimSockets()
	syscall.Kill(-c.proc.cmd.Process.Pid, syscall.SIGKILL)
	<-c.proc.done
	killContainers(c.Address, c.CgroupParent)
	// A reboot empties /run, where the shims killed left their sockets,
	// and what outpost's shim start recorded.
	removeShimSockets(sockets)
	os.RemoveAll(c.shimRecords())
	if err := ResetTmpfs(c.State); err != nil {
		t.Fatalf("power cut: %v", err)
	}
	if reboot != nil {
		reboot()
	}
	cl := c.start(t)
	t.Cleanup(func() {
		c.stopFirst()
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer removeShimSockets(c.shimSockets())
		removeAll(ctx, cl)
	})
}

// shimSocketRE matches the address of a runc shim's socket.
var shimSocketRE = regexp.MustCompile(`unix://(/run/containerd/s/[0-9a-f]{64})`)

// shimSockets returns the sockets of the daemon's task shims, as their
// bundles name them (address, written by the runc shim of containerd 1.6
// and 1.7 and by outpost's shim start, and bootstrap.json, by containerd
// 2): the runc shim makes them under /run/containerd/s, whichever
// containerd runs it, and removes them only when it exits cleanly.
func (c *Containerd) shimSockets() []string {
	var sockets []string
	for _, name := range []string{"address", "bootstrap.json"} {
		files, _ := filepath.Glob(filepath.Join(c.State, "io.containerd.runtime.v2.task", "*", "*", name))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			for _, m := range shimSocketRE.FindAllSubmatch(b, -1) {
				sockets = append(sockets, string(m[1]))
			}
		}
	}
	return sockets
}

// removeShimSockets removes sockets.
func removeShimSockets(sockets []string) {
	for _, s := range sockets {
		os.Remove(s)
	}
}

// shimRecords is where outpost's shim start (cmd/containerd-shim-outpost-v2)
// keeps its records for the daemon's shims, in place of
// /run/outpost/shim-start: the daemon's environment says so.
func (c *Containerd) shimRecords() string { return filepath.Join(c.dir, "shim-start") }

// Restart stops the daemon alone, with SIGKILL when crash is set or else
// SIGTERM (as `systemctl restart containerd`), and starts it again on the
// same socket, root and state: shims and containers keep running.
func (c *Containerd) Restart(t testing.TB, crash bool) {
	t.Helper()
	sig := syscall.SIGTERM
	if crash {
		sig = syscall.SIGKILL
	}
	c.proc.cmd.Process.Signal(sig)
	select {
	case <-c.proc.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("containerd did not stop on %v within 30 s", sig)
	}
	c.start(t).Close()
}

// PID returns the daemon's process ID.
func (c *Containerd) PID() int { return c.proc.cmd.Process.Pid }

// Client returns a client of the daemon in namespace ns, closed in t's
// cleanup.
func (c *Containerd) Client(t testing.TB, ns string) *containerd.Client {
	t.Helper()
	cl, err := containerd.New(c.Address, containerd.WithDefaultNamespace(ns), containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// removeAll kills and deletes every task and container in every namespace.
func removeAll(ctx context.Context, cl *containerd.Client) error {
	nss, err := cl.NamespaceService().List(ctx)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		cs, err := cl.Containers(nctx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if task, err := c.Task(nctx, nil); err == nil {
				task.Kill(nctx, 9)
				if ch, err := task.Wait(nctx); err == nil {
					select {
					case <-ch:
					case <-time.After(5 * time.Second):
					}
				}
				task.Delete(nctx, containerd.WithProcessKill)
			}
			c.Delete(nctx, containerd.WithSnapshotCleanup)
		}
	}
	return nil
}

// ImportTestImage writes the test image for this machine's busybox binaries
// and imports it into ns, unpacked for the overlayfs snapshotter.
func (c *Containerd) ImportTestImage(t testing.TB, ns string) containerd.Image {
	t.Helper()
	return c.importImage(t, ns, TestImage, TestImageTarball(t))
}

// ImportImage imports into ns the test image named name (a full reference
// with a tag) whose command is cmd: with sleep, say, a pod sandbox image.
func (c *Containerd) ImportImage(t testing.TB, ns, name string, cmd ...string) containerd.Image {
	t.Helper()
	return c.ImportImageConfig(t, ns, name, ImageConfig{Cmd: cmd})
}

// ImportImageConfig imports into ns the test image named name (a full
// reference with a tag) with config cfg.
func (c *Containerd) ImportImageConfig(t testing.TB, ns, name string, cfg ImageConfig) containerd.Image {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := writeImage(f, busyboxBinaries(t), name, cfg); err != nil {
		t.Fatal(err)
	}
	return c.importImage(t, ns, name, path)
}

func (c *Containerd) importImage(t testing.TB, ns, name, path string) containerd.Image {
	t.Helper()
	cl := c.Client(t, ns)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	imgs, err := cl.Import(ctx, f, containerd.WithAllPlatforms(true))
	if err != nil {
		t.Fatalf("import test image: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Name != name {
		t.Fatalf("imported %+v, want one image %s", imgs, name)
	}
	img := containerd.NewImage(cl, imgs[0])
	if err := img.Unpack(ctx, "overlayfs"); err != nil {
		t.Fatalf("unpack test image: %v", err)
	}
	return img
}

// TestImageTarball writes the test image into t's temp dir from the
// busybox binaries install.sh put in ToolsDir, and returns its path.
func TestImageTarball(t testing.TB) string {
	t.Helper()
	return TestImageTarballAs(t, TestImage)
}

// TestImageTarballAs writes the test image named name (a full reference
// with a tag) into t's temp dir, and returns its path.
func TestImageTarballAs(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "busybox-image.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteTestImageAs(f, busyboxBinaries(t), name); err != nil {
		t.Fatal(err)
	}
	return path
}

// busyboxBinaries returns the busybox binaries install.sh put in
// ToolsDir, by GOARCH.
func busyboxBinaries(t testing.TB) map[string]string {
	t.Helper()
	bins := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(ToolsDir(), "busybox", arch, "busybox")
		if _, err := os.Stat(p); err == nil {
			bins[arch] = p
		}
	}
	if len(bins) == 0 {
		t.Fatalf("no busybox in %s/busybox: run `make testenv` (as root) first", ToolsDir())
	}
	return bins
}
