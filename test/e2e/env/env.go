// Package env starts the real components end-to-end tests run against, each
// private to the test that starts it: a containerd with its own socket and
// root, etcd plus kube-apiserver on free loopback ports with generated
// certificates, a mosquitto broker, and an OCI registry. Everything a test
// starts is stopped by PID and its files removed in the test's cleanup.
//
// The packages come from scripts/testenv/install.sh and the control-plane
// and registry binaries from scripts/testenv/build-tools.sh (`make
// testenv` runs both).
// Without root, every starter skips the test and says why.
package env

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent/cgroups"
	"github.com/outpost-edge/outpost/internal/waittest"
)

// ToolsDir returns where build-tools.sh put the control-plane and registry
// binaries and install.sh the busybox binaries.
func ToolsDir() string {
	if d := os.Getenv("OUTPOST_TOOLS"); d != "" {
		return d
	}
	return "/var/cache/outpost-testenv"
}

// RequireRoot skips t unless it runs as root, which the real components
// need (containerd, network namespaces, nftables).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end test needs root (containerd, netns, nftables): run `sudo make test`")
	}
}

// lookTool returns the path of a tool, from ToolsDir/bin first, then PATH.
// A missing tool fails the test: as root, `make testenv` provides it.
func lookTool(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(ToolsDir(), "bin", name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Fatalf("%s not found in %s/bin or PATH: run `make testenv` (as root) first", name, ToolsDir())
	return ""
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
//
// It is drawn at random from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), so that no outgoing connection of the
// machine can take it between this call and the listen of whoever asked
// (seen once: etcd could not bind its client port).
func FreePort(t testing.TB) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000
	if low > first+1000 {
		for range 200 {
			port := first + rand.IntN(low-first)
			if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				ln.Close()
				return port
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// process is a started component.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs a component with its output in dir/<name>.log and stops it in
// t's cleanup: SIGTERM, then SIGKILL after 10 s.
func start(t testing.TB, dir, name string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("last lines of %s log:\n%s", name, tail(logPath, 30))
		}
	})
	return p
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls ready until it returns nil, the process exits, or timeout.
func waitReady(t testing.TB, p *process, timeout time.Duration, ready func() error) {
	t.Helper()
	waittest.Poll{Timeout: timeout, Every: 100 * time.Millisecond}.For(t, p.name+" ready", func() (bool, string) {
		err := ready()
		if err == nil {
			return true, ""
		}
		if p.exited() {
			t.Fatalf("%s exited before it was ready (%v); log:\n%s", p.name, p.cmd.ProcessState, tail(p.log, 40))
		}
		return false, fmt.Sprintf("%v; log:\n%s", err, tail(p.log, 40))
	})
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// killByCmdline kills every process whose command line mentions needle,
// such as containerd shims left behind by a test's containerd.
func killByCmdline(needle string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte(needle)) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// killContainers kills, with SIGKILL, every container started by the shims
// of the containerd at address (each shim's children are the containers'
// init processes; killing one ends its whole PID namespace), then the
// shims themselves, then whatever is left in the cgroup parent the
// daemon's agent gives its pods.
func killContainers(address, cgroupParent string) {
	shims := map[int]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte(address)) {
			shims[pid] = true
		}
	}
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so read after ')'.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		var state string
		var pid, ppid int
		fmt.Sscanf(e.Name(), "%d", &pid)
		if _, err := fmt.Sscanf(string(rest), " %s %d", &state, &ppid); err == nil && shims[ppid] {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for pid := range shims {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	killCgroup(cgroupParent)
}

// killCgroup kills, with SIGKILL, every process in a cgroup under parent
// (a container whose init was not, or no longer, a shim's child); the
// processes of other cgroups, another agent's pods among them, are left
// alone.
func killCgroup(parent string) {
	if parent == "" || parent == "/" {
		return
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(":"+parent+"/")) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err == nil && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// RemoveCgroups removes, in every hierarchy, the cgroups of the pods with
// these UIDs under parent or, with none, parent itself and everything
// below it, waiting up to 5 s for the processes killed in them to be
// gone; what is still there then is a test error.
func RemoveCgroups(t testing.TB, parent string, podUIDs ...string) {
	tree := cgroups.Tree{Parent: parent}
	remove := func() error {
		if len(podUIDs) == 0 {
			return tree.RemoveAll()
		}
		var errs []error
		for _, uid := range podUIDs {
			errs = append(errs, tree.RemovePod(uid))
		}
		return errors.Join(errs...)
	}
	var err error
	for range 50 {
		if err = remove(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("remove cgroups under %s: %v", parent, err)
}

// Tmpfs mounts an empty tmpfs on dir (made if missing), as /run is on a
// real machine, and unmounts it, and what was mounted under it, in t's
// cleanup.
func Tmpfs(t testing.TB, dir string) {
	t.Helper()
	if err := mountTmpfs(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(dir)
		syscall.Unmount(dir, syscall.MNT_DETACH)
	})
}

// ResetTmpfs replaces the tmpfs on dir (Tmpfs) with an empty one, as a
// reboot empties /run; what was mounted under it is unmounted first.
func ResetTmpfs(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return mountTmpfs(dir)
}

func mountTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// unmountUnder lazily unmounts every mount below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

// Tool returns the path of a test tool (kubectl, metrics-server, ...),
// failing t when it has not been built.
func Tool(t testing.TB, name string) string {
	t.Helper()
	return lookTool(t, name)
}
