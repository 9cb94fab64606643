package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// scratchPod checks, at each start, that its memory-backed emptyDir (a
// tmpfs the agent mounts) is a tmpfs in the container.
const scratchPod = `apiVersion: v1
kind: Pod
metadata: {name: scratch}
spec:
  containers:
  - name: main
    image: ` + env.TestImage + `
    command: [sh, -c, 'if grep -q " /scratch tmpfs " /proc/mounts; then echo "scratch is a tmpfs"; else echo "scratch is not a tmpfs"; fi; exec sleep 3600']
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - name: scratch
    emptyDir: {medium: Memory}
`

// TestE2ECrun runs the pods on crun (containerd.ociRuntime: crun): a web
// server reachable on its pod IP and ready by its probe, its log, a
// memory-backed emptyDir, and the same pods back after a power cut, each
// time started by crun (its state, not runc's, in the shim's runtime
// root). crun is one of the test packages (scripts/testenv/install.sh).
func TestE2ECrun(t *testing.T) {
	env.RequireRoot(t)
	if _, err := exec.LookPath("crun"); err != nil {
		t.Fatalf("crun: %v (scripts/testenv/install.sh installs it)", err)
	}
	n := newNodeOn(t, "e2e-crun", env.StartContainerdV1Only(t), "crun")
	n.write("web.yaml", webPod)
	n.write("sensor.yaml", sensorPod)
	n.write("scratch.yaml", scratchPod)
	n.start()
	check := func(when string) {
		t.Helper()
		web := n.waitPod("web-e2e-crun", 60*time.Second, "running and ready "+when, func(p *agent.PodInfo) bool { return running(p) && ready(p) })
		out, err := n.fetch("http://" + web.Status.PodIP + ":8080/")
		if err != nil || !strings.Contains(out, "hello from outpost") {
			t.Fatalf("fetch from pod IP %s: %v: %q", when, err, out)
		}
		n.waitPod("sensor-e2e-crun", 30*time.Second, "running "+when, running)
		n.waitPod("scratch-e2e-crun", 30*time.Second, "running "+when, running)
		tasks := n.runningTasks(t)
		if len(tasks) != 3 {
			t.Fatalf("%d running tasks %s, want 3: %v", len(tasks), when, tasks)
		}
		// The runc shim keeps its OCI runtime's state under its root:
		// crun writes a status file there, runc a state.json.
		for id := range tasks {
			dir := filepath.Join("/run/containerd/runc", n.ns, id)
			if _, err := os.Stat(filepath.Join(dir, "status")); err != nil {
				t.Errorf("task %s %s: no crun state: %v", id, when, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "state.json")); err == nil {
				t.Errorf("task %s %s: runc's state.json in %s", id, when, dir)
			}
		}
		n.waitLogs("sensor-e2e-crun", 30*time.Second, "started on e2e-crun")
		if out := n.waitLogs("scratch-e2e-crun", 30*time.Second, "scratch is"); !strings.Contains(out, "scratch is a tmpfs") {
			t.Errorf("memory-backed emptyDir %s: %q", when, out)
		}
	}
	check("at first")

	n.powerCut(t)
	n.start()
	check("after a power cut")
}
