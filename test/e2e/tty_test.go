package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// ttyScript tells whether its stdout is a terminal, then writes a line
// to stderr.
const ttyScript = `if [ -t 1 ]; then echo is-a-tty; else echo not-a-tty; fi; echo via-stderr >&2; sleep 3600`

// TestTTY runs a container with tty: true beside one without: the first
// finds a terminal on its stdout and its stderr line comes out of the
// terminal too, so its CRI log holds stdout lines only; the second finds
// no terminal and its stderr line is logged as stderr.
func TestTTY(t *testing.T) {
	n := newNode(t, "e2e-tty")
	n.write("tty.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: tty}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: term
    image: %[1]s
    tty: true
    command: [sh, -c, %[2]q]
  - name: plain
    image: %[1]s
    command: [sh, -c, %[2]q]
`, env.TestImage, ttyScript))
	n.start()
	n.waitPod("tty-e2e-tty", 30*time.Second, "running", running)

	term := n.waitLogs("tty-e2e-tty", 10*time.Second, "via-stderr", "-c", "term")
	if !strings.Contains(term, "is-a-tty") {
		t.Errorf("tty container logged %q, want is-a-tty", term)
	}
	plain := n.waitLogs("tty-e2e-tty", 10*time.Second, "via-stderr", "-c", "plain")
	if !strings.Contains(plain, "not-a-tty") {
		t.Errorf("container without tty logged %q, want not-a-tty", plain)
	}
	// The CRI log file: one stream with a terminal, two without, and the
	// terminal's "\r\n" line ends dropped.
	for _, tc := range []struct {
		container string
		want      map[string]string // line content → stream
	}{
		{"term", map[string]string{"is-a-tty": "stdout", "via-stderr": "stdout"}},
		{"plain", map[string]string{"not-a-tty": "stdout", "via-stderr": "stderr"}},
	} {
		got := n.logStreams("tty-e2e-tty", tc.container)
		for content, stream := range tc.want {
			if got[content] != stream {
				t.Errorf("container %s: log line %q on stream %q, want %q (all: %q)", tc.container, content, got[content], stream, got)
			}
		}
	}
}

// TestStdin runs a container with stdin: true beside one without, both
// reading a line from stdin: the first waits (the agent holds its stdin
// FIFO open for writing and writes nothing) and is not restarted, the
// second reads the end of input at once. Killing the agent and starting
// it again changes nothing for the first: the new agent opens its stdin
// FIFO for writing again, and the container still waits.
func TestStdin(t *testing.T) {
	const script = `echo started; read line; echo stdin-closed; sleep 3600`
	const pod = "stdin-e2e-stdin"
	n := newNode(t, "e2e-stdin")
	n.write("stdin.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: stdin}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: in
    image: %[1]s
    stdin: true
    command: [sh, -c, %[2]q]
  - name: plain
    image: %[1]s
    command: [sh, -c, %[2]q]
`, env.TestImage, script))
	n.start()
	p := n.waitPod(pod, 30*time.Second, "running", running)
	ids := map[string]string{}
	for _, c := range p.Status.ContainerStatuses {
		ids[c.Name] = strings.TrimPrefix(c.ContainerID, "containerd://")
	}

	n.waitLogs(pod, 10*time.Second, "stdin-closed", "-c", "plain")
	n.waitLogs(pod, 10*time.Second, "started", "-c", "in")
	n.waitStdinWriter(ids["in"], 10*time.Second)
	if k := n.stdinWriters(ids["plain"]); k != 0 {
		t.Fatalf("agent holds %d stdin FIFOs of the container without stdin", k)
	}
	stillWaiting := func(when string) {
		t.Helper()
		time.Sleep(3 * time.Second)
		if logs, err := n.outpost("logs", pod, "-c", "in"); err != nil || !strings.Contains(logs, "started") || strings.Contains(logs, "stdin-closed") {
			t.Fatalf("%s: container with stdin logged %q (%v); want started and still reading", when, logs, err)
		}
		p := n.waitPod(pod, 10*time.Second, "running", running)
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 || strings.TrimPrefix(c.ContainerID, "containerd://") != ids[c.Name] {
				t.Fatalf("%s: container %s is %s with %d restarts, want %s with none", when, c.Name, c.ContainerID, c.RestartCount, ids[c.Name])
			}
		}
	}
	stillWaiting("3 s after start")

	// The agent is away for a while: the shim holds a writing end of
	// stdin of its own, so the container sees no end of input meanwhile.
	n.kill()
	time.Sleep(2 * time.Second)
	n.start()
	n.waitPod(pod, 30*time.Second, "running after the agent restart", running)
	n.waitStdinWriter(ids["in"], 15*time.Second)
	stillWaiting("after an agent restart")
}

// logStreams reads the CRI log of a pod's container (attempt 0) and maps
// each line's content to its stream.
func (n *node) logStreams(pod, container string) map[string]string {
	n.t.Helper()
	files, _ := filepath.Glob(filepath.Join(n.dir, "logs", "default_"+pod+"_*", container, "0.log"))
	if len(files) != 1 {
		n.t.Fatalf("log files of %s/%s: %v", pod, container, files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		n.t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		// TIMESTAMP STREAM TAG CONTENT
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 {
			n.t.Fatalf("log line %q is not in the CRI format", line)
		}
		out[f[3]] = f[1]
	}
	return out
}

// agentPID returns the PID of the node's running agent process.
func (n *node) agentPID() int {
	n.t.Helper()
	if n.agent == nil {
		n.t.Fatal("agent not running")
	}
	// nsenter executes the agent in its own place, so its PID is the
	// agent's; check that it is.
	pid := n.agent.Process.Pid
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(n.cfg)) || !bytes.HasPrefix(cmdline, []byte(outpostBin+"\x00")) {
		n.t.Fatalf("process %d is not the agent: %q %v", pid, cmdline, err)
	}
	return pid
}

// stdinWriters counts the agent's file descriptors open for writing on
// the stdin FIFO of container id.
func (n *node) stdinWriters(id string) int {
	n.t.Helper()
	pid := n.agentPID()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		n.t.Fatal(err)
	}
	count := 0
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil || !strings.HasSuffix(target, "/"+id+"-stdin") {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				if err == nil && flags&3 != 0 { // O_WRONLY or O_RDWR, not O_PATH
					count++
				}
			}
		}
	}
	return count
}

// waitStdinWriter waits until the agent holds the stdin FIFO of container
// id open for writing.
func (n *node) waitStdinWriter(id string, timeout time.Duration) {
	n.t.Helper()
	within(timeout).Until(n.t, "the agent to hold the stdin FIFO of "+id+" open for writing", func() bool { return n.stdinWriters(id) > 0 })
}
