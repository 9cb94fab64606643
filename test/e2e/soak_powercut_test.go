package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
)

func init() { addSoakTrial(20, "PowerCut", soakPowerCut) }

// soakPowerCut is trial 2 of docs/soak.md: 30 pods (10 web servers with
// an exec readiness probe, 20 sleepers), then power cuts (3 quick, 50
// full) as in TestE2EPowerCutRecovery: agent, containerd, shims and
// containers killed at once, runc's state and every network namespace
// wiped, no network. After each, every pod is back from the store, running
// and ready, with the same address, and each container's restart count
// is the number of cuts so far. It gives the time from the agent's start
// to the last pod ready (median and max).
func soakPowerCut(t *testing.T, sc soakScale, r *soakResult) {
	cuts := sc.n(3, 50)
	n := newNode(t, "soak-power")
	ctl := t.TempDir()
	var names []string
	for i := range 30 {
		name := fmt.Sprintf("p%02d", i)
		if i < 10 {
			n.write(name+".yaml", backendPod(name, ctl))
		} else {
			n.write(name+".yaml", podManifest(name, "Always", "while true; do sleep 1; done"))
		}
		names = append(names, name+"-"+n.name)
	}
	n.start()
	up := func(p *agent.PodInfo) bool { return running(p) && ready(p) }
	ips := map[string]string{}
	for _, name := range names {
		ips[name] = n.waitPod(name, 120*time.Second, "running and ready", up).Status.PodIP
	}
	r.set("0 of %d cuts; 30 pods running and ready", cuts)
	var took []time.Duration
	for cut := 1; cut <= cuts; cut++ {
		n.powerCut(t)
		start := time.Now()
		n.start()
		within(120*time.Second).For(t, fmt.Sprintf("30 pods back after power cut %d", cut), func() (bool, string) {
			s, err := n.status()
			if err != nil || s.From != "agent" {
				return false, fmt.Sprintf("status: %v", err)
			}
			back := 0
			for _, name := range names {
				if p := findPod(s, name); p != nil && p.Status != nil && p.Synced && up(p) {
					back++
				}
			}
			return back == len(names), fmt.Sprintf("%d of %d back", back, len(names))
		})
		took = append(took, time.Since(start))
		s, err := n.status()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			p := findPod(s, name)
			if p.Status.PodIP != ips[name] {
				t.Errorf("power cut %d: pod %s has address %s; it had %s", cut, name, p.Status.PodIP, ips[name])
			}
			if rc := p.Status.ContainerStatuses[0].RestartCount; rc != int32(cut) {
				t.Errorf("power cut %d: pod %s restart count %d; want %d", cut, name, rc, cut)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		sorted := slices.Clone(took)
		slices.Sort(sorted)
		r.set("%d of %d cuts; 30 pods back each time, same addresses, restart counts = cuts; back in median %v, max %v after the agent started",
			cut, cuts, sorted[len(sorted)/2].Round(10*time.Millisecond), sorted[len(sorted)-1].Round(10*time.Millisecond))
	}
}
