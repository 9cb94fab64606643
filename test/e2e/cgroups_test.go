package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
)

// TestE2EPodCgroupsGoWithTheirPods creates and removes 200 static pods in
// rounds, a third of them crash-looping (so they have several attempts),
// and kills the agent in the middle of a round's removal; afterwards the
// cgroups under the node's cgroup parent are exactly the live pod's, in
// every hierarchy, and it holds only cgroups of containers that exist.
func TestE2EPodCgroupsGoWithTheirPods(t *testing.T) {
	n := newNode(t, "e2e-cgroups")
	n.write("keep.yaml", podManifest("keep", "Always", "while true; do sleep 1; done"))
	n.start()
	keep := n.waitPod("keep-e2e-cgroups", 60*time.Second, "running", running)
	const rounds, perRound = 5, 40
	for r := range rounds {
		var names []string
		for i := range perRound {
			name := fmt.Sprintf("c%d-%d", r, i)
			script := "while true; do sleep 1; done"
			if i%3 == 0 {
				script = "exit 1"
			}
			n.write(name+".yaml", podManifest(name, "Always", script))
			names = append(names, name)
		}
		for i, name := range names {
			cond, what := running, "running"
			if i%3 == 0 {
				// The first round waits for a restart: a second attempt.
				cond, what = func(p *agent.PodInfo) bool { return p.Status != nil && len(p.Status.ContainerStatuses) == 1 }, "started"
				if r == 0 {
					cond, what = func(p *agent.PodInfo) bool {
						return p.Status != nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
					}, "restarted"
				}
			}
			n.waitPod(name+"-e2e-cgroups", 90*time.Second, what, cond)
		}
		for _, name := range names {
			os.Remove(filepath.Join(n.manifests, name+".yaml"))
		}
		if r == 2 {
			// Killed while it removes them: the next agent finishes.
			time.Sleep(300 * time.Millisecond)
			n.kill()
			n.start()
		}
		within(90*time.Second).For(t, fmt.Sprintf("round %d's pods removed", r), func() (bool, string) {
			s, err := n.status()
			if err != nil || s.From != "agent" {
				return false, fmt.Sprint(err)
			}
			return len(s.Pods) == 1, fmt.Sprintf("%d pods", len(s.Pods))
		})
		t.Logf("round %d: %d pods created and removed", r, perRound)
	}

	n.wantCgroupsOf(t, keep.UID)
}

// wantCgroupsOf waits until the cgroups under the node's cgroup parent
// are exactly those of the pods with these UIDs, in every hierarchy, and
// checks that each holds only cgroups of containers that exist.
func (n *node) wantCgroupsOf(t *testing.T, uids ...string) {
	t.Helper()
	hs := cgroupHierarchies(t)
	if n.ctrd.WithoutUnified() {
		// Its OCI runtime makes no cgroup there.
		hs = slices.DeleteFunc(hs, func(h string) bool { return h == "/sys/fs/cgroup/unified" })
	}
	if len(hs) == 0 {
		t.Fatal("no cgroup hierarchy found under /sys/fs/cgroup")
	}
	var want []string
	for _, uid := range uids {
		want = append(want, "pod"+uid)
	}
	slices.Sort(want)
	within(30*time.Second).For(t, fmt.Sprintf("the node's cgroups exactly those of its %d pods", len(uids)), func() (bool, string) {
		var wrong []string
		for _, h := range hs {
			got := subdirs(filepath.Join(h, n.ctrd.CgroupParent))
			if !slices.Equal(got, want) {
				wrong = append(wrong, fmt.Sprintf("%s: %d pod cgroups %v", h, len(got), first(got, 5)))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
	ids := strings.Fields(run(t, "ctr", "-a", n.ctrd.Address, "-n", n.ns, "containers", "ls", "-q"))
	for _, h := range hs {
		for _, pod := range want {
			for _, c := range subdirs(filepath.Join(h, n.ctrd.CgroupParent, pod)) {
				if !slices.Contains(ids, c) {
					t.Errorf("%s: %s's cgroup holds %s, which is no container (containers: %v)", h, pod, c, ids)
				}
			}
		}
	}
}

// cgroupHierarchies returns the mounted cgroup hierarchies: the root on
// cgroup v2, else each v1 hierarchy (symbolic links such as cpu to
// cpu,cpuacct left out).
func cgroupHierarchies(t *testing.T) []string {
	t.Helper()
	const root = "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return []string{root}
	}
	var out []string
	for _, d := range subdirs(root) {
		out = append(out, filepath.Join(root, d))
	}
	return out
}

// subdirs returns the names of the directories in dir, sorted.
func subdirs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
