package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// fakeNetwork reserves 10.42.0.2 for every pod and fails Setup while
// down; each Setup records the runtime's calls made before it.
type fakeNetwork struct {
	calls func() []string
	mu    sync.Mutex
	down  bool
	seen  [][]string // the runtime's calls at each Setup
}

const fakeNetNS = "/run/netns/pod"

var fakePodIP = netip.MustParseAddr("10.42.0.2")

func (n *fakeNetwork) Reserve(string) (string, netip.Addr, error) {
	return fakeNetNS, fakePodIP, nil
}

func (n *fakeNetwork) Setup(context.Context, string) (string, netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seen = append(n.seen, n.calls())
	if n.down {
		return "", netip.Addr{}, errors.New("veth: no space left on device")
	}
	return fakeNetNS, fakePodIP, nil
}

func (n *fakeNetwork) Teardown(context.Context, string) error { return nil }

func (n *fakeNetwork) setups() [][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.seen)
}

// A pod's container is created before its network is made, so containerd
// creates it while the agent makes the other pods' networks; it starts
// only once the network is made. Until then the pod shows no address and
// its container is ContainerCreating.
func TestNetworkMadeAfterCreateBeforeStart(t *testing.T) {
	h := newHarness(t)
	fn := &fakeNetwork{calls: h.rt.Calls, down: true}
	h.net = fn
	web := newPod("web", corev1.RestartPolicyAlways, ctr("app"))
	app := id(web, "app", 0)
	h.put(web)
	h.start()
	h.synced(0, "app created, its network refused", func() bool {
		return h.state(web, "app") == "waiting:ContainerCreating" && len(fn.setups()) > 0
	})
	if h.count("create "+app) != 1 || h.count("start ") != 0 {
		t.Fatalf("calls %q, want app created and not started", h.rt.Calls())
	}
	if st, _, _ := h.status(web); st.PodIP != "" || h.condition(web, corev1.PodReadyToStartContainers) != corev1.ConditionFalse {
		t.Errorf("pod IP %q and PodReadyToStartContainers %s without a network, want none and False", st.PodIP, h.condition(web, corev1.PodReadyToStartContainers))
	}
	if got := fn.setups()[0]; !slices.Contains(got, "create "+app) {
		t.Errorf("network set up before the container was created: calls then %q", got)
	}

	fn.mu.Lock()
	fn.down = false
	fn.mu.Unlock()
	h.advance(5 * time.Second)
	h.eventually("app running", func() bool { return h.state(web, "app") == "running" })
	if h.count("create ") != 1 {
		t.Errorf("calls %q, want the created container started, not another", h.rt.Calls())
	}
	st, _, _ := h.status(web)
	if st.PodIP != fakePodIP.String() || h.condition(web, corev1.PodReadyToStartContainers) != corev1.ConditionTrue {
		t.Errorf("pod IP %q and PodReadyToStartContainers %s, want %s and True", st.PodIP, h.condition(web, corev1.PodReadyToStartContainers), fakePodIP)
	}
	if spec, ok := h.rt.Spec(app); !ok || spec.NetNSPath != fakeNetNS {
		t.Errorf("app's netns %q, want %s", spec.NetNSPath, fakeNetNS)
	}
}
