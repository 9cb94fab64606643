package packaging

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// The upgrade while the agent runs a pod. systemd is not in the chroot, so
// the test plays its part: a fake systemctl records what the maintainer
// scripts ask of it, and the test does what systemd does with the unit's
// KillMode=process: try-restart sends SIGTERM to the agent's own process
// alone, then starts the new binary. The agent runs on the host, from the
// chroot's /usr/bin/outpost, with a config of temp dirs, a private
// containerd (test/e2e/env) and a network namespace of its own.

// upgradeNode is the agent's node name; its static pod is named
// sleeper-<node>.
const upgradeNode = "pkg-upgrade"

const sleeperManifest = `apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: ` + env.TestImage + `
    command: [sh, -c, 'while true; do sleep 1; done']
`

// fakeSystemctl records its arguments, a line per call, in
// /run/systemctl.calls.
const fakeSystemctl = "#!/bin/sh\necho \"$*\" >>/run/systemctl.calls\n"

// fakeSystemd makes the chroot look booted with systemd to the maintainer
// scripts (/run/systemd/system) and puts fakeSystemctl on their PATH,
// both removed in t's cleanup. The returned func returns the calls made
// since its last call.
func fakeSystemd(t *testing.T, root string) func() []string {
	t.Helper()
	bin := filepath.Join(root, "usr/bin/systemctl")
	if _, err := os.Lstat(bin); err == nil {
		t.Fatalf("the chroot has a systemctl of its own: %s", bin)
	}
	log := filepath.Join(root, "run/systemctl.calls")
	t.Cleanup(func() {
		os.Remove(bin)
		os.Remove(log)
		os.RemoveAll(filepath.Join(root, "run/systemd"))
	})
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte(fakeSystemctl), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		t.Helper()
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(log, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
}

// binVersion returns the version `outpost version` prints.
func binVersion(t *testing.T, bin string) string {
	t.Helper()
	out := run(t, ".", bin, "version")
	first, _, _ := strings.Cut(out, "\n")
	v, ok := strings.CutPrefix(first, "outpost ")
	if !ok {
		t.Fatalf("%s version: %q", bin, out)
	}
	return v
}

// podNode is the agent's world: temp dirs, a private containerd with the
// test image in a namespace of its own, and a network namespace that
// plays the host's (bridge, veths and nftables live there).
type podNode struct {
	dir, cfg, netns, ns string
	ctrd                *env.Containerd
	uids                []string // of the pods seen, whose netns cleanup removes
}

// newPodNode makes the node and removes, in t's cleanup, what the agent
// made outside its temp dirs: the pods' network namespaces, its own
// network namespace, and mounts below its dir. containerd's cleanup
// (test/e2e/env) removes the containers.
func newPodNode(t *testing.T) *podNode {
	t.Helper()
	id := time.Now().UnixNano() % 1e9
	n := &podNode{dir: t.TempDir(), netns: fmt.Sprintf("pkgtest-%d", id), ns: fmt.Sprintf("outpost-pkgtest-%d", id)}
	// The agents of every version give pods /outpost/pod<UID>: this
	// test's pods' cgroups are removed once containerd's cleanup (which
	// runs first) killed their containers.
	t.Cleanup(func() {
		if len(n.uids) > 0 {
			env.RemoveCgroups(t, "/outpost", n.uids...)
		}
	})
	ctrd := env.StartContainerd(t)
	n.ctrd = ctrd
	ctrd.ImportTestImage(t, n.ns)
	manifests := filepath.Join(n.dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "sleeper.yaml"), []byte(sleeperManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	n.cfg = filepath.Join(n.dir, "config.yaml")
	cfg := fmt.Sprintf(`nodeName: %s
stateDir: %s
manifestDir: %s
imageDir: %s
logDir: %s
runDir: %s
containerd:
  address: %s
  namespace: %s
log:
  level: debug
`, upgradeNode, filepath.Join(n.dir, "state"), manifests, filepath.Join(n.dir, "images"),
		filepath.Join(n.dir, "logs"), filepath.Join(n.dir, "run"), ctrd.Address, n.ns)
	if err := os.WriteFile(n.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ".", "ip", "netns", "add", n.netns)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", lastLines(filepath.Join(n.dir, "agent.log"), 60))
		}
		// Named as netproxy/podnet names them: outpost- and the first
		// 12 characters of the UID without dashes.
		for _, uid := range n.uids {
			u := strings.ReplaceAll(uid, "-", "")
			p := filepath.Join("/run/netns", "outpost-"+u[:min(12, len(u))])
			syscall.Unmount(p, syscall.MNT_DETACH)
			os.Remove(p)
		}
		if out, err := exec.Command("ip", "netns", "delete", n.netns).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", n.netns, err, out)
		}
		if err := unmountBelow(n.dir); err != nil {
			t.Error(err)
		}
	})
	run(t, ".", "ip", "netns", "exec", n.netns, "ip", "link", "set", "lo", "up")
	return n
}

// agentProc is a running agent.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs bin as the agent in the node's network namespace (nsenter
// enters that one only: the agent must share the host's mount namespace
// with containerd), appending to dir/agent.log; t's cleanup kills it.
func (n *podNode) start(t *testing.T, bin string) *agentProc {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(n.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns, bin, "agent", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		if !a.exited() {
			cmd.Process.Signal(syscall.SIGKILL)
			<-a.done
		}
	})
	return a
}

// exited reports whether the agent has ended.
func (a *agentProc) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, as systemd does to the unit's main process, and
// waits for the agent to exit.
func (a *agentProc) stop(t *testing.T) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not exit within 20 s of SIGTERM")
	}
	if !a.cmd.ProcessState.Success() {
		t.Errorf("the agent exited with %v on SIGTERM, want 0", a.cmd.ProcessState)
	}
}

// waitRunning polls `bin status` until the running agent a reports the
// sleeper pod running, and returns it.
func (n *podNode) waitRunning(t *testing.T, bin string, a *agentProc) *agent.PodInfo {
	t.Helper()
	name := "sleeper-" + upgradeNode
	var last *agent.PodInfo
	lastSeen := func() (bool, string) {
		js, _ := json.MarshalIndent(last, "", "  ")
		return false, "\n" + string(js)
	}
	waittest.Poll{Timeout: 90 * time.Second, Every: 200 * time.Millisecond}.For(t, "pod "+name+" running", func() (bool, string) {
		if a.exited() {
			t.Fatalf("the agent exited (%v) before pod %s ran", a.cmd.ProcessState, name)
		}
		out, err := exec.Command(bin, "status", "-o", "json", "--config", n.cfg).Output()
		var s agent.Status
		if err != nil || json.Unmarshal(out, &s) != nil || s.From != "agent" {
			return lastSeen()
		}
		i := slices.IndexFunc(s.Pods, func(p agent.PodInfo) bool { return p.Name == name })
		if i < 0 {
			return lastSeen()
		}
		last = &s.Pods[i]
		if !slices.Contains(n.uids, last.UID) {
			n.uids = append(n.uids, last.UID)
		}
		st := last.Status
		if last.Synced && st != nil && st.Phase == corev1.PodRunning && len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].State.Running != nil {
			return true, ""
		}
		return lastSeen()
	})
	return last
}

// taskPID returns the PID of the running task of the container the
// status names (containerd://ID), asking containerd, not the agent.
func (n *podNode) taskPID(t *testing.T, cs corev1.ContainerStatus) uint32 {
	t.Helper()
	id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
	if !ok {
		t.Fatalf("container %s: ID %q is not containerd://…", cs.Name, cs.ContainerID)
	}
	cl := n.ctrd.Client(t, n.ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cl.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("container %s: %v", id, err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatalf("container %s: task: %v", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil || st.Status != containerd.Running {
		t.Fatalf("container %s: task %v (%v), want running", id, st.Status, err)
	}
	return task.Pid()
}

// upgradeWithPods installs 0.1.0~rc.1 in the chroot, runs its agent with a
// static pod, upgrades to 0.1.0 with dpkg -i while it runs, restarts the
// agent as systemd would, and checks that the pod's container is the same
// process throughout, never restarted, and that the new binary runs. Then
// it purges the package: the chroot is as it was before the install.
func upgradeWithPods(t *testing.T, root string) {
	needTools(t, "containerd", "runc", "nsenter", "ip")
	if _, err := os.Stat(filepath.Join(env.ToolsDir(), "busybox")); err != nil {
		t.Skipf("no busybox for the test image in %s: run `make testenv` (as root)", env.ToolsDir())
	}
	// From no outpost at all, whatever the purge subtest left.
	inChroot(t, root, "dpkg --purge outpost >/dev/null 2>&1; rm -rf /etc/outpost /var/lib/outpost")
	calls := fakeSystemd(t, root)
	before := tree(t, root)
	wantCalls := func(step string, want ...string) {
		t.Helper()
		if got := calls(); !slices.Equal(got, want) {
			t.Errorf("%s: the scripts called systemctl %q, want %q", step, got, want)
		}
	}

	dpkgOK(t, root, "dpkg -i /opt/outpost/versions/outpost_0.1.0~rc.1-1_*.deb")
	if got := dpkgState(t, root); got != "ii 0.1.0~rc.1-1" {
		t.Fatalf("dpkg state %q, want ii 0.1.0~rc.1-1", got)
	}
	// Not configured (the shipped config, no manifest): enabled, not started.
	wantCalls("install", "daemon-reload", "enable outpost.service")
	bin := filepath.Join(root, "usr/bin/outpost")
	if v := binVersion(t, bin); v != "v0.1.0-rc.1" {
		t.Fatalf("the installed binary says version %s, want v0.1.0-rc.1", v)
	}

	n := newPodNode(t)
	old := n.start(t, bin)
	pod := n.waitRunning(t, bin, old)
	was := pod.Status.ContainerStatuses[0]
	pid := n.taskPID(t, was)

	dpkgOK(t, root, "dpkg -i /opt/outpost/versions/outpost_0.1.0-1_*.deb")
	if got := dpkgState(t, root); got != "ii 0.1.0-1" {
		t.Fatalf("after the upgrade dpkg state %q, want ii 0.1.0-1", got)
	}
	// The agent's restart, nothing else: no stop, nothing of containerd.
	wantCalls("upgrade", "daemon-reload", "try-restart outpost.service")
	if old.exited() {
		t.Fatalf("the old agent exited during the upgrade: %v", old.cmd.ProcessState)
	}
	// try-restart with KillMode=process: SIGTERM to the agent alone,
	// then the new binary. In between no agent runs; the container does.
	old.stop(t)
	if p := n.taskPID(t, was); p != pid {
		t.Errorf("with the old agent stopped, the container's PID is %d, was %d", p, pid)
	}
	if v := binVersion(t, bin); v != "v0.1.0" {
		t.Fatalf("the upgraded binary says version %s, want v0.1.0", v)
	}
	cur := n.start(t, bin)
	pod = n.waitRunning(t, bin, cur)
	now := pod.Status.ContainerStatuses[0]
	if now.ContainerID != was.ContainerID || now.RestartCount != 0 || !now.State.Running.StartedAt.Equal(&was.State.Running.StartedAt) {
		t.Errorf("after the upgrade the container is %s (restarts %d, started %v), want %s (restarts 0, started %v)",
			now.ContainerID, now.RestartCount, now.State.Running.StartedAt, was.ContainerID, was.State.Running.StartedAt)
	}
	if p := n.taskPID(t, now); p != pid {
		t.Errorf("after the upgrade the container's PID is %d, was %d", p, pid)
	}
	cur.stop(t)

	// Purged after the upgrade: the agent stopped and disabled, dpkg's
	// state and every file of the package gone.
	dpkgOK(t, root, "dpkg --purge outpost")
	wantCalls("purge", "stop outpost.service", "disable outpost.service", "daemon-reload", "daemon-reload")
	checkForgotten(t, root)
	if added, removed := treeDiff(before, tree(t, root)); len(added)+len(removed) > 0 {
		t.Errorf("install, upgrade, purge: added %v, removed %v; want the chroot as before", added, removed)
	}
}

// unmountBelow lazily unmounts every mount below dir, deepest first (the
// tmpfs volumes of pods still running would keep it from being removed).
func unmountBelow(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var mounts []string
	for s := bufio.NewScanner(f); s.Scan(); {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	var errs []error
	for _, m := range slices.Backward(mounts) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// lastLines returns the last n lines of a file, or why it cannot.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
