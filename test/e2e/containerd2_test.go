package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// TestE2EContainerd2 runs a node's pods on containerd 2 and its runc shim,
// as the containerd.io package installs them, across a power cut. Seven
// pods share the node's 4 shim groups, so the shim start binary answers
// most tasks' starts itself; it must answer as 2's runc shim does (with
// version 3 of the task API, the only one that shim serves), not with the
// bare address of containerd 1.6's, which containerd 2 takes for version
// 2.
func TestE2EContainerd2(t *testing.T) {
	ctrd := env.StartContainerd2(t)
	if !strings.HasPrefix(strings.TrimPrefix(ctrd.Version, "v"), "2.") {
		t.Fatalf("containerd version %q, want 2.x", ctrd.Version)
	}
	n := newNodeOn(t, "e2e-ctrd2", ctrd, "")
	n.write("web.yaml", webPod)
	names := []string{"web-e2e-ctrd2"}
	for i := range 6 {
		name := fmt.Sprintf("loop-%d", i)
		n.write(name+".yaml", podManifest(name, "Always", "while true; do sleep 1; done"))
		names = append(names, name+"-e2e-ctrd2")
	}
	n.start()
	waitAll := func(what string) {
		t.Helper()
		for _, name := range names {
			n.waitPod(name, 60*time.Second, what, func(p *agent.PodInfo) bool {
				return running(p) && (name != "web-e2e-ctrd2" || ready(p))
			})
		}
	}
	waitAll("running")
	n.checkShimStart(t)
	n.checkShimProcs(t)
	n.checkTaskAPIVersion(t, 3)

	n.powerCut(t)
	n.start()
	waitAll("back")
	n.checkTaskAPIVersion(t, 3)
	web := n.waitPod("web-e2e-ctrd2", 10*time.Second, "ready", ready)
	out, err := n.fetch("http://" + web.Status.PodIP + ":8080/")
	if err != nil || !strings.Contains(out, "hello from outpost") {
		t.Fatalf("fetch after power cut: %v: %q", err, out)
	}
}

// checkTaskAPIVersion checks that containerd 2 speaks version want of the
// task API to the shims of the node's running tasks: the version their
// shim start answered, which containerd keeps in the bundle.
func (n *node) checkTaskAPIVersion(t *testing.T, want int) {
	t.Helper()
	tasks := n.runningTasks(t)
	if len(tasks) == 0 {
		t.Fatal("no running task")
	}
	for id := range tasks {
		b, err := os.ReadFile(filepath.Join(n.ctrd.State, "io.containerd.runtime.v2.task", n.ns, id, "bootstrap.json"))
		var params struct {
			Version int `json:"version"`
		}
		if err == nil {
			err = json.Unmarshal(b, &params)
		}
		if err != nil || params.Version != want {
			t.Errorf("task %s: bootstrap.json %s (%v): task API version %d, want %d", id, b, err, params.Version, want)
		}
	}
}
