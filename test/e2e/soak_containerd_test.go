package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
)

func init() { addSoakTrial(50, "Containerd", soakContainerdRestarts) }

// soakContainerdRestarts is trial 5 of docs/soak.md: containerd restarted
// under a running agent (5 quick, 20 full), by turns stopped with SIGTERM
// and killed with SIGKILL. After each restart the agent is still running,
// every pod keeps its container (same ID, same task process, restart count
// unchanged) and is ready again, a pod added afterwards runs and one
// removed goes: the agent reattached.
func soakContainerdRestarts(t *testing.T, sc soakScale, r *soakResult) {
	restarts := sc.n(5, 20)
	n := newNode(t, "soak-ctrd")
	ctl := t.TempDir()
	steady := []string{"web", "sensor", "b1", "b2"}
	n.write("web.yaml", webPod)
	n.write("sensor.yaml", sensorPod)
	n.write("b1.yaml", backendPod("b1", ctl))
	n.write("b2.yaml", backendPod("b2", ctl))
	n.start()
	up := func(p *agent.PodInfo) bool { return running(p) && ready(p) }
	type container struct {
		id      string
		restart int32
	}
	before := map[string]container{}
	for _, name := range steady {
		p := n.waitPod(name+"-"+n.name, 60*time.Second, "running and ready", up)
		c := p.Status.ContainerStatuses[0]
		before[name] = container{c.ContainerID, c.RestartCount}
	}
	pids := taskPIDs(t, n)
	extra := false
	for i := 1; i <= restarts; i++ {
		crash := i%2 == 0
		n.ctrd.Restart(t, crash)
		how := "SIGTERM"
		if crash {
			how = "SIGKILL"
		}
		// The agent reattached: what it does next reaches containerd.
		extra = !extra
		if extra {
			n.write("extra.yaml", podManifest("extra", "Always", "while true; do sleep 1; done"))
			n.waitPod("extra-"+n.name, 60*time.Second, fmt.Sprintf("running after containerd's restart %d (%s)", i, how), running)
		} else {
			os.Remove(filepath.Join(n.manifests, "extra.yaml"))
			within(60*time.Second).For(t, fmt.Sprintf("pod extra gone after containerd's restart %d (%s)", i, how), func() (bool, string) {
				s, err := n.status()
				return err == nil && findPod(s, "extra-"+n.name) == nil, fmt.Sprint(err)
			})
		}
		for _, name := range steady {
			p := n.waitPod(name+"-"+n.name, 60*time.Second, "running and ready", up)
			c := p.Status.ContainerStatuses[0]
			if b := before[name]; c.ContainerID != b.id || c.RestartCount != b.restart {
				t.Errorf("containerd's restart %d (%s): pod %s runs container %s, restart count %d; before: %s, %d", i, how, name, c.ContainerID, c.RestartCount, b.id, b.restart)
			}
		}
		now := taskPIDs(t, n)
		for id, pid := range pids {
			if now[id] != pid {
				t.Errorf("containerd's restart %d (%s): task %s has process %q; it had %q", i, how, id, now[id], pid)
			}
		}
		select {
		case <-n.done:
			t.Fatalf("containerd's restart %d (%s): the agent exited", i, how)
		default:
		}
		if t.Failed() {
			t.FailNow()
		}
		r.set("%d of %d restarts (by turns SIGTERM and SIGKILL); the agent kept running; %d pods kept their containers and processes, restart counts unchanged; a pod added or removed after each", i, restarts, len(steady))
	}
	// The agent still hears containerd's events: a container killed now
	// is restarted.
	id := strings.TrimPrefix(before["sensor"].id, "containerd://")
	pid := pids[id]
	if pid == "" {
		t.Fatalf("no process for the sensor's task %s in %v", id, pids)
	}
	killed := time.Now()
	run(t, "kill", "-9", pid)
	n.waitPod("sensor-"+n.name, 30*time.Second, "restarted after its process was killed", func(p *agent.PodInfo) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == before["sensor"].restart+1
	})
	r.set("%d restarts (by turns SIGTERM and SIGKILL); the agent kept running; %d pods kept their containers and processes, restart counts unchanged; a pod added or removed after each; then a container killed was restarted in %v (its back-off: 10 s)", restarts, len(steady), time.Since(killed).Round(10*time.Millisecond))
}

// taskPIDs returns the process of each running task of the node's
// containerd namespace, by task ID.
func taskPIDs(t *testing.T, n *node) map[string]string {
	t.Helper()
	out := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "tasks", "ls")
	pids := map[string]string{}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "RUNNING" {
			pids[f[0]] = f[1]
		}
	}
	return pids
}
