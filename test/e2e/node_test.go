package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// outpostBin is the binary under test, built once by TestMain as root;
// echoBin is the test helper of test/e2e/echo, static, which pods run
// from a hostPath volume of its directory.
var outpostBin, echoBin string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() == 0 {
			dir, err := os.MkdirTemp("", "outpost-e2e-bin-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			outpostBin = filepath.Join(dir, "outpost")
			echoBin = filepath.Join(dir, "echo", "echo")
			for _, b := range []struct {
				out, pkg string
				env      []string
				args     []string
			}{
				{outpostBin, "./cmd/outpost", nil, []string{"-tags", "grpcnotrace"}},
				// The shim start binary beside outpost, as the packages
				// install it, so the agent hands it to containerd.
				{filepath.Join(dir, "containerd-shim-outpost-v2"), "./cmd/containerd-shim-outpost-v2", []string{"CGO_ENABLED=0"}, nil},
				{echoBin, "./test/e2e/echo", []string{"CGO_ENABLED=0"}, nil},
			} {
				build := exec.Command("go", append(append([]string{"build"}, b.args...), "-o", b.out, b.pkg)...)
				build.Dir = "../.."
				build.Env = append(os.Environ(), b.env...)
				build.Stdout, build.Stderr = os.Stderr, os.Stderr
				if err := build.Run(); err != nil {
					fmt.Fprintln(os.Stderr, "build", b.pkg+":", err)
					return 1
				}
			}
		}
		code := m.Run()
		writeSoakReport()
		return code
	}()
	os.Exit(code)
}

// node is an outpost agent under test: its own state, manifest, log and
// run dirs, a private containerd, and a network namespace of its own that
// plays the host's (bridge, veths and the nftables table live there, never
// in the real host's namespace).
type node struct {
	t         testing.TB
	name      string
	dir       string
	manifests string
	cfg       string
	netns     string
	// netnsPrefix starts the names of this node's pod namespaces
	// (network.netnsPrefix): this node's alone, so its cleanup and its
	// power cut delete no other agent's.
	netnsPrefix string
	ctrd        *env.Containerd
	ns          string // containerd namespace
	agent       *exec.Cmd
	agentLog    *os.File
	done        chan struct{}
}

// e2eOCIRuntime is the OCI runtime newNode's agents run their pods on
// (containerd.ociRuntime): OUTPOST_E2E_OCI_RUNTIME, as crun, runs the
// tests that make their nodes with newNode on it; empty is runc.
var e2eOCIRuntime = os.Getenv("OUTPOST_E2E_OCI_RUNTIME")

func newNode(t testing.TB, name string) *node {
	t.Helper()
	env.RequireRoot(t)
	if e2eOCIRuntime != "" {
		return newNodeOn(t, name, env.StartContainerdV1Only(t), e2eOCIRuntime)
	}
	return newNodeOn(t, name, env.StartContainerd(t), "")
}

// newNodeOn is newNode on the containerd ctrd, its pods on the OCI
// runtime ociRuntime ("" is runc; another needs a containerd of
// StartContainerdV1Only on a hybrid host).
func newNodeOn(t testing.TB, name string, ctrd *env.Containerd, ociRuntime string) *node {
	t.Helper()
	// A namespace of its own: runc keeps state under /run/containerd/runc/<namespace>,
	// shared by every containerd on the machine.
	ns := fmt.Sprintf("outpost-e2e-%d", time.Now().UnixNano()%1e9)
	ctrd.ImportTestImage(t, ns)
	dir := ctrd.TempDir(t)
	id := time.Now().UnixNano() % 1e9
	n := &node{t: t, name: name, dir: dir, manifests: filepath.Join(dir, "manifests"), ctrd: ctrd, ns: ns,
		netns: fmt.Sprintf("outpost-e2e-%d", id), netnsPrefix: fmt.Sprintf("op%d-", id)}
	os.Mkdir(n.manifests, 0o755)
	run(t, "ip", "netns", "add", n.netns)
	run(t, "ip", "netns", "exec", n.netns, "ip", "link", "set", "lo", "up")
	t.Cleanup(func() {
		n.kill()
		n.removePodNetns()
		exec.Command("ip", "netns", "delete", n.netns).Run()
	})
	ctrd.StopFirst(n.kill)
	n.cfg = filepath.Join(dir, "config.yaml")
	cfg := fmt.Sprintf(`nodeName: %s
stateDir: %s
manifestDir: %s
imageDir: %s
logDir: %s
runDir: %s
containerd:
  address: %s
  namespace: %s
  cgroupParent: %s
  ociRuntime: %q
network:
  netnsPrefix: %s
log:
  level: debug
`, name, filepath.Join(dir, "state"), n.manifests, filepath.Join(dir, "images"), filepath.Join(dir, "logs"), filepath.Join(dir, "run"), ctrd.Address, ns, ctrd.CgroupParent, ociRuntime, n.netnsPrefix)
	if err := os.WriteFile(n.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// Content volumes (tmpfs) of pods still running at the end would keep
	// the temp dir from being removed.
	n.unmountAtExit()
	return n
}

// removePodNetns unmounts and removes the pod network namespaces this
// node's agent made (its netnsPrefix), as a reboot would lose them.
func (n *node) removePodNetns() {
	removeNetnsPins(func(e string) bool { return strings.HasPrefix(e, n.netnsPrefix) })
}

// removeNetnsPins unmounts and removes the network namespace pins in
// /run/netns whose names match.
func removeNetnsPins(match func(name string) bool) {
	for e := range netnsEntries() {
		if match(e) {
			p := filepath.Join("/run/netns", e)
			syscall.Unmount(p, syscall.MNT_DETACH)
			os.Remove(p)
		}
	}
}

// addNetns makes the network namespace name, with lo up.
func addNetns(t testing.TB, name string) {
	t.Helper()
	for _, args := range [][]string{{"ip", "netns", "add", name}, {"ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func netnsEntries() map[string]bool { return dirEntries("/run/netns") }

// dirEntries returns the names in dir.
func dirEntries(dir string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// write puts a manifest file into the node's manifest dir.
func (n *node) write(name, body string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.manifests, name), []byte(body), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// start runs the agent inside the node's network namespace.
func (n *node) start() {
	n.t.Helper()
	logf, err := os.OpenFile(filepath.Join(n.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	// nsenter enters only the network namespace: `ip netns exec` would also
	// give the agent a private mount namespace, hiding the pod namespaces
	// it bind-mounts from containerd.
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns, outpostBin, "agent", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.agent, n.agentLog, n.done = cmd, logf, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); logf.Close(); close(done) }(n.done)
	n.t.Cleanup(func() {
		if n.t.Failed() {
			b, _ := os.ReadFile(filepath.Join(n.dir, "agent.log"))
			lines := strings.Split(string(b), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			n.t.Logf("agent log:\n%s", strings.Join(lines, "\n"))
		}
	})
}

// kill stops the agent with SIGKILL, as a crash or power cut would.
func (n *node) kill() {
	if n.agent == nil {
		return
	}
	n.agent.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.agent = nil
}

// stop stops the agent with SIGTERM; its pods keep running.
func (n *node) stop() {
	if n.agent == nil {
		return
	}
	n.agent.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		n.t.Fatal("agent did not stop on SIGTERM within 20 s")
	}
	n.agent = nil
}

// outpost runs the CLI against the node's config.
func (n *node) outpost(args ...string) (string, error) {
	args = append(args, "--config", n.cfg)
	out, err := exec.Command(outpostBin, args...).CombinedOutput()
	return string(out), err
}

// status returns the agent's status.
func (n *node) status() (agent.Status, error) {
	var s agent.Status
	out, err := exec.Command(outpostBin, "status", "-o", "json", "--config", n.cfg).Output()
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(out, &s)
	return s, err
}

func findPod(s agent.Status, name string) *agent.PodInfo {
	for i := range s.Pods {
		if s.Pods[i].Name == name {
			return &s.Pods[i]
		}
	}
	return nil
}

// waitPod polls status until cond holds for the named pod, as computed by
// the running agent (not the journal's last-known status), for at most
// timeout, and returns the pod.
func (n *node) waitPod(name string, timeout time.Duration, what string, cond func(p *agent.PodInfo) bool) *agent.PodInfo {
	n.t.Helper()
	var last *agent.PodInfo
	within(timeout).For(n.t, "pod "+name+" "+what, func() (bool, string) {
		if s, err := n.status(); err == nil && s.From == "agent" {
			if p := findPod(s, name); p != nil {
				last = p
				if p.Status != nil && p.Synced && cond(p) {
					return true, ""
				}
			}
		}
		js, _ := json.MarshalIndent(last, "", "  ")
		return false, "\n" + string(js)
	})
	return last
}

func running(p *agent.PodInfo) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

func ready(p *agent.PodInfo) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// fetch GETs url from inside the node's network namespace, where the pod
// network lives: the connection is dialled from a thread switched into it.
func (n *node) fetch(url string) (string, error) {
	u := strings.TrimPrefix(url, "http://")
	hostport, path, _ := strings.Cut(u, "/")
	conn, err := dialInNetns("/run/netns/"+n.netns, hostport)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n", path, hostport)
	var out bytes.Buffer
	_, err = out.ReadFrom(conn)
	return out.String(), err
}

func dialInNetns(nsPath, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread goes back to its own namespace and is unlocked: a
		// thread that exits while locked may be the one that started an
		// agent, whose Pdeathsig then kills it. Only when the way back
		// fails does the thread stay locked, and exit with the goroutine.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			ch <- result{nil, err}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func unmount(p string) { syscall.Unmount(p, syscall.MNT_DETACH) }
