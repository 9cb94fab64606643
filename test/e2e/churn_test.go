package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
)

// TestE2EAgentKilledDuringChurn kills the agent with SIGKILL 20 times at
// random moments while manifests come and go. Afterwards every desired pod
// runs exactly one container (no duplicates), no pod is lost, and the
// containers of removed pods are cleaned up.
func TestE2EAgentKilledDuringChurn(t *testing.T) {
	n := newNode(t, "e2e-churn")
	stable := []string{"alpha", "beta", "gamma"}
	for _, name := range stable {
		n.write(name+".yaml", podManifest(name, "Always", "while true; do sleep 1; done"))
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	present := map[string]bool{}
	for i := range 20 {
		// Churn: a pod appears or goes away before each start.
		name := fmt.Sprintf("churn%d", rng.IntN(4))
		if present[name] {
			os.Remove(filepath.Join(n.manifests, name+".yaml"))
			delete(present, name)
		} else {
			n.write(name+".yaml", podManifest(name, "Always", "while true; do sleep 1; done"))
			present[name] = true
		}
		n.start()
		time.Sleep(time.Duration(200+rng.IntN(1200)) * time.Millisecond)
		n.kill()
		if i%5 == 4 {
			t.Logf("%d kills", i+1)
		}
	}
	n.start()
	want := append([]string(nil), stable...)
	for name := range present {
		want = append(want, name)
	}
	for _, name := range want {
		n.waitPod(name+"-e2e-churn", 60*time.Second, "running", running)
	}
	// Give removals a moment to finish, then count what containerd runs.
	within(30*time.Second).For(t, fmt.Sprintf("one running task for each of %v after 20 kills", want), func() (bool, string) {
		tasks := runningTasks(t, n)
		ok := len(tasks) == len(want)
		for _, name := range want {
			if tasks[podUIDPrefix(t, n, name+"-e2e-churn")] != 1 {
				ok = false
			}
		}
		if ok {
			return true, ""
		}
		// Which attempts run, for the next one to read the failure.
		return false, fmt.Sprintf("running tasks per pod %v; tasks:\n%s", tasks,
			run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "tasks", "ls"))
	})
	s, err := n.status()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pods) != len(want) {
		t.Fatalf("status lists %d pods, want %d", len(s.Pods), len(want))
	}
}

// runningTasks counts running tasks per container-ID prefix (the first 12
// characters of the pod UID).
func runningTasks(t *testing.T, n *node) map[string]int {
	t.Helper()
	out := run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "tasks", "ls")
	counts := map[string]int{}
	for _, line := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "RUNNING" && len(f[0]) > 12 {
			counts[f[0][:12]]++
		}
	}
	return counts
}

func podUIDPrefix(t *testing.T, n *node, name string) string {
	t.Helper()
	p := n.waitPod(name, 30*time.Second, "known", func(*agent.PodInfo) bool { return true })
	return strings.ReplaceAll(p.UID, "-", "")[:12]
}
