package kube

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// ---- unit tests ----

var ndEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ndStatus is a node's status as the agent reports it.
func ndStatus() corev1.NodeStatus {
	q := resource.MustParse
	cond := func(typ corev1.NodeConditionType, status corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: status, Reason: reason, Message: "outpost says " + reason}
	}
	return corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"cpu": q("4"), "memory": q("3884108Ki"), "pods": q("110"), "ephemeral-storage": q("29Gi")},
		Allocatable: corev1.ResourceList{"cpu": q("4"), "memory": q("3781708Ki"), "pods": q("110"), "ephemeral-storage": q("26726160Ki")},
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
		},
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.20"}, {Type: corev1.NodeHostName, Address: "edge"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID: "8f1c2a7e4b5d4e6f9a0b1c2d3e4f5a6b", BootID: "5d3f0c8a-2b1e-4c7d-9a6f-1e2d3c4b5a69",
			KernelVersion: "6.6.51+rpt-rpi-v8", OSImage: "Debian GNU/Linux 12 (bookworm)",
			ContainerRuntimeVersion: "containerd://2.1.4", OperatingSystem: "linux", Architecture: runtime.GOARCH,
		},
	}
}

func ndCondition(st corev1.NodeStatus, typ corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func ndSetCondition(st *corev1.NodeStatus, typ corev1.NodeConditionType, status corev1.ConditionStatus, reason string) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == typ {
			st.Conditions[i].Status, st.Conditions[i].Reason = status, reason
		}
	}
}

// The status is sent when it changed in anything but heartbeat times, or
// when NodeStatusPeriod passed since the last send; a condition keeps its
// transition time while its status stays.
func TestNodeStatusChangeDetection(t *testing.T) {
	const period = 5 * time.Minute
	type step struct {
		at     time.Duration // since ndEpoch
		change func(*corev1.NodeStatus)
		due    bool
	}
	memoryPressure := func(st *corev1.NodeStatus) {
		ndSetCondition(st, corev1.NodeMemoryPressure, corev1.ConditionTrue, "KubeletHasInsufficientMemory")
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "heartbeat only", steps: []step{{at: 0, due: true}, {at: 10 * time.Second}, {at: 4*time.Minute + 59*time.Second}}},
		{name: "period passed", steps: []step{{at: 0, due: true}, {at: 10 * time.Second}, {at: period, due: true}, {at: period + 10*time.Second}, {at: 2 * period, due: true}}},
		{name: "condition status", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: memoryPressure, due: true}, {at: 20 * time.Second, change: memoryPressure}}},
		{name: "condition message", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: func(st *corev1.NodeStatus) {
			st.Conditions[3].Message = "outpost is posting ready status"
		}, due: true}}},
		{name: "capacity", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: func(st *corev1.NodeStatus) {
			st.Capacity["cpu"] = resource.MustParse("3")
		}, due: true}}},
		{name: "address", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: func(st *corev1.NodeStatus) {
			st.Addresses[0].Address = "192.168.1.21"
		}, due: true}}},
		{name: "runtime version", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: func(st *corev1.NodeStatus) {
			st.NodeInfo.ContainerRuntimeVersion = "containerd://2.1.5"
		}, due: true}}},
		// A quantity written another way is the same quantity.
		{name: "same quantity", steps: []step{{at: 0, due: true}, {at: 10 * time.Second, change: func(st *corev1.NodeStatus) {
			st.Capacity["ephemeral-storage"] = *resource.NewQuantity(29<<30, resource.BinarySI)
		}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr nodeStatusTracker
			for i, s := range tc.steps {
				facts := ndStatus()
				if s.change != nil {
					s.change(&facts)
				}
				now := ndEpoch.Add(s.at)
				st := tr.build(facts, now)
				if got := tr.due(st, now, period); got != s.due {
					t.Fatalf("step %d (at %s): due = %v, want %v", i, s.at, got, s.due)
				}
				if s.due {
					tr.sent(st, now)
				}
			}
		})
	}
}

func TestNodeStatusTimes(t *testing.T) {
	var tr nodeStatusTracker
	st := tr.build(ndStatus(), ndEpoch.Add(500*time.Millisecond))
	for _, c := range st.Conditions {
		if !c.LastHeartbeatTime.Time.Equal(ndEpoch) || !c.LastTransitionTime.Time.Equal(ndEpoch) {
			t.Errorf("%s: heartbeat %v, transition %v; want both %v (whole seconds)", c.Type, c.LastHeartbeatTime, c.LastTransitionTime, ndEpoch)
		}
	}
	if v := st.NodeInfo.KubeletVersion; v != kubeletVersion || !strings.HasSuffix(v, "+outpost") {
		t.Errorf("kubeletVersion %q, want %q", v, kubeletVersion)
	}
	tr.sent(st, ndEpoch)

	later := ndEpoch.Add(time.Minute)
	facts := ndStatus()
	ndSetCondition(&facts, corev1.NodeMemoryPressure, corev1.ConditionTrue, "KubeletHasInsufficientMemory")
	st = tr.build(facts, later)
	if c := ndCondition(st, corev1.NodeMemoryPressure); !c.LastTransitionTime.Time.Equal(later) || !c.LastHeartbeatTime.Time.Equal(later) {
		t.Errorf("changed MemoryPressure: transition %v, heartbeat %v; want both %v", c.LastTransitionTime, c.LastHeartbeatTime, later)
	}
	if c := ndCondition(st, corev1.NodeReady); !c.LastTransitionTime.Time.Equal(ndEpoch) || !c.LastHeartbeatTime.Time.Equal(later) {
		t.Errorf("unchanged Ready: transition %v, heartbeat %v; want %v, %v", c.LastTransitionTime, c.LastHeartbeatTime, ndEpoch, later)
	}

	// What the Node holds seeds the transition times: a Ready that the
	// node controller set Unknown while we were away gets a new one.
	old := metav1.NewTime(ndEpoch.Add(-time.Hour))
	tr.observe(corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: metav1.NewTime(later)},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, LastTransitionTime: old},
	}})
	back := later.Add(time.Hour)
	st = tr.build(ndStatus(), back)
	if c := ndCondition(st, corev1.NodeReady); !c.LastTransitionTime.Time.Equal(back) {
		t.Errorf("Ready after Unknown: transition %v, want %v", c.LastTransitionTime, back)
	}
	if c := ndCondition(st, corev1.NodeDiskPressure); !c.LastTransitionTime.Equal(&old) {
		t.Errorf("DiskPressure as the Node had it: transition %v, want %v", c.LastTransitionTime, old)
	}
	if !tr.due(st, back, time.Hour) {
		t.Error("status after observe is not due; it must be sent in full")
	}

	// A Node that holds our status as we would send it, with a recent
	// heartbeat, needs no write after a reconnect (kubelet reads the
	// Node and compares too); an old heartbeat or any difference does.
	var fresh nodeStatusTracker
	held := fresh.build(ndStatus(), ndEpoch)
	var again nodeStatusTracker
	again.observe(*held.DeepCopy())
	soon := ndEpoch.Add(3 * time.Minute)
	if st := again.build(ndStatus(), soon); again.due(st, soon, 5*time.Minute) {
		t.Error("status the Node already holds, heartbeat 3 min old: due, want no write")
	}
	again.observe(*held.DeepCopy())
	if st := again.build(ndStatus(), ndEpoch.Add(6*time.Minute)); !again.due(st, ndEpoch.Add(6*time.Minute), 5*time.Minute) {
		t.Error("status the Node already holds, heartbeat 6 min old: not due, want a write")
	}
	changed := *held.DeepCopy()
	changed.Conditions[0].Status = corev1.ConditionUnknown
	again.observe(changed)
	if st := again.build(ndStatus(), soon); !again.due(st, soon, 5*time.Minute) {
		t.Error("Node marked Unknown meanwhile: not due, want a write")
	}
}

// The first patch carries every field we own, addresses replaced whole;
// later ones the conditions and what changed.
func TestNodeStatusPatch(t *testing.T) {
	var tr nodeStatusTracker
	first := tr.build(ndStatus(), ndEpoch)
	decode := func(b []byte) map[string]json.RawMessage {
		t.Helper()
		var p struct{ Status map[string]json.RawMessage }
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		return p.Status
	}
	body, err := nodeStatusPatch(nil, first)
	if err != nil {
		t.Fatal(err)
	}
	p := decode(body)
	for _, k := range []string{"conditions", "capacity", "allocatable", "nodeInfo", "daemonEndpoints", "addresses"} {
		if _, ok := p[k]; !ok {
			t.Errorf("first patch has no %s: %s", k, body)
		}
	}
	if want := `[{"type":"InternalIP","address":"192.168.1.20"},{"type":"Hostname","address":"edge"},{"$patch":"replace"}]`; string(p["addresses"]) != want {
		t.Errorf("addresses %s, want %s", p["addresses"], want)
	}
	if !strings.Contains(string(p["nodeInfo"]), `"kubeletVersion":"`+kubeletVersion+`"`) {
		t.Errorf("nodeInfo %s lacks kubeletVersion %s", p["nodeInfo"], kubeletVersion)
	}

	next := tr.build(ndStatus(), ndEpoch.Add(5*time.Minute))
	body, err = nodeStatusPatch(&first, next)
	if err != nil {
		t.Fatal(err)
	}
	if p := decode(body); len(p) != 1 || p["conditions"] == nil {
		t.Errorf("heartbeat patch %s, want only conditions", body)
	}

	facts := ndStatus()
	facts.Addresses = facts.Addresses[1:]
	facts.Capacity["cpu"] = resource.MustParse("3")
	changed := tr.build(facts, ndEpoch.Add(5*time.Minute))
	body, err = nodeStatusPatch(&first, changed)
	if err != nil {
		t.Fatal(err)
	}
	p = decode(body)
	if _, ok := p["capacity"]; !ok || len(p) != 3 {
		t.Errorf("patch %s, want conditions, capacity and addresses", body)
	}
	if want := `[{"type":"Hostname","address":"edge"},{"$patch":"replace"}]`; string(p["addresses"]) != want {
		t.Errorf("addresses %s, want %s", p["addresses"], want)
	}
}

func TestNodeMaySetLabel(t *testing.T) {
	for key, want := range map[string]bool{
		"kubernetes.io/hostname":                   true,
		"kubernetes.io/arch":                       true,
		"kubernetes.io/os":                         true,
		"beta.kubernetes.io/arch":                  true,
		"topology.kubernetes.io/zone":              true,
		"topology.kubernetes.io/region":            true,
		"failure-domain.beta.kubernetes.io/zone":   true,
		"node.kubernetes.io/instance-type":         true,
		"node.kubernetes.io/anything":              true,
		"sub.node.kubernetes.io/x":                 true,
		"kubelet.kubernetes.io/x":                  true,
		"outpost.io/board":                         true,
		"example.com/kubernetes.io":                true,
		"plain":                                    true,
		"node-role.kubernetes.io/edge":             false,
		"kubernetes.io/role":                       false,
		"topology.kubernetes.io/rack":              false,
		"k8s.io/x":                                 false,
		"sub.k8s.io/x":                             false,
		"node-restriction.kubernetes.io/x":         false,
		"a.node-restriction.kubernetes.io/x":       false,
		"notkubernetes.io/x":                       true,
		"beta.kubernetes.io/instance-type":         true,
		"failure-domain.beta.kubernetes.io/region": true,
	} {
		if got := nodeMaySetLabel(key); got != want {
			t.Errorf("nodeMaySetLabel(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestNodeKubeletVersion(t *testing.T) {
	info := func(v string, replace string) *debug.BuildInfo {
		m := &debug.Module{Path: "k8s.io/api", Version: v}
		if replace != "" {
			m.Replace = &debug.Module{Path: "example.com/api", Version: replace}
		}
		return &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/apimachinery", Version: "v0.99.0"}, m}}
	}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"release", info("v0.37.2", ""), true, "v1.37.2+outpost"},
		{"pre-release", info("v0.38.0-alpha.1", ""), true, "v1.38.0-alpha.1+outpost"},
		{"replaced", info("v0.37.2", "v0.36.1"), true, "v1.36.1+outpost"},
		{"pseudo-version", info("v0.0.0-20260101000000-abcdefabcdef", ""), true, fallbackKubeVersion + "+outpost"},
		{"no build info", nil, false, fallbackKubeVersion + "+outpost"},
	} {
		if got := kubeVersion(tc.info, tc.ok); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	semver := regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?\+outpost$`)
	if !semver.MatchString(kubeletVersion) {
		t.Errorf("kubeletVersion %q is not a semantic version naming outpost", kubeletVersion)
	}
	// The fallback follows go.mod.
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/api v0\.(\d+\.\d+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no k8s.io/api")
	}
	if want := "v1." + string(m[1]); fallbackKubeVersion != want {
		t.Errorf("fallbackKubeVersion = %s, but go.mod's k8s.io/api is Kubernetes %s", fallbackKubeVersion, want)
	}
	if bi, ok := debug.ReadBuildInfo(); ok && len(bi.Deps) > 0 && kubeletVersion != "v1."+string(m[1])+"+outpost" {
		t.Errorf("kubeletVersion %s, want it from the linked k8s.io/api v0.%s", kubeletVersion, m[1])
	}
}

// ndClock is a fake clock that records the timers and tickers made.
type ndClock struct {
	*clocktest.Fake
	mu      sync.Mutex
	timers  []time.Duration
	tickers []time.Duration
}

// NewTimer and NewTicker record d once the fake clock has the waiter: a
// test that sees it made may Advance at once, and an Advance before the
// waiter exists would be lost (seen under qemu-arm).
func (c *ndClock) NewTimer(d time.Duration) clock.Timer {
	t := c.Fake.NewTimer(d)
	c.mu.Lock()
	c.timers = append(c.timers, d)
	c.mu.Unlock()
	return t
}

func (c *ndClock) NewTicker(d time.Duration) clock.Ticker {
	t := c.Fake.NewTicker(d)
	c.mu.Lock()
	c.tickers = append(c.tickers, d)
	c.mu.Unlock()
	return t
}

func (c *ndClock) made() (timers, tickers []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.timers), slices.Clone(c.tickers)
}

// ndAPI is a fake API server for one Node and its Lease: enough of the
// protocol for the node loop, and a log of the requests.
type ndAPI struct {
	t    *testing.T
	name string

	mu       sync.Mutex
	fail     int // answer every request with this code; 0 serves
	node     *corev1.Node
	lease    *coordv1.Lease
	rv       int
	requests []string // "METHOD path code"
	patches  [][]byte // status patches
}

func (f *ndAPI) setFail(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = code
}

// log returns the requests from the i-th on.
func (f *ndAPI) log(from int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests[min(from, len(f.requests)):])
}

func (f *ndAPI) count(prefix string) int {
	n := 0
	for _, r := range f.log(0) {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func (f *ndAPI) statusPatches() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.patches)
}

func (f *ndAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	code, obj := f.serve(r, body)
	f.requests = append(f.requests, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, code))
	if code >= 300 {
		obj = &metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: int32(code), Reason: metav1.StatusReason(strings.ReplaceAll(http.StatusText(code), " ", "")), Message: "fake",
		}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		f.t.Error(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b)
}

func (f *ndAPI) serve(r *http.Request, body []byte) (int, any) {
	if f.fail != 0 {
		return f.fail, nil
	}
	nodePath := "/api/v1/nodes/" + f.name
	leasePath := "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/" + f.name
	decode := func(into any) bool {
		obj, _, err := codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			f.t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
			return false
		}
		switch p := into.(type) {
		case **corev1.Node:
			*p = obj.(*corev1.Node)
		case **coordv1.Lease:
			*p = obj.(*coordv1.Lease)
		}
		return true
	}
	f.rv++
	rv := strconv.Itoa(f.rv)
	switch {
	case r.Method == http.MethodGet && r.URL.Path == nodePath:
		if f.node == nil {
			return http.StatusNotFound, nil
		}
		return http.StatusOK, f.node
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/nodes":
		var n *corev1.Node
		if !decode(&n) {
			return http.StatusBadRequest, nil
		}
		if f.node != nil {
			return http.StatusConflict, nil
		}
		n.UID, n.ResourceVersion = types.UID("uid-"+rv), rv
		n.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
		f.node = n
		return http.StatusCreated, n
	case r.Method == http.MethodPatch && r.URL.Path == nodePath+"/status":
		if f.node == nil {
			return http.StatusNotFound, nil
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/strategic-merge-patch+json" {
			f.t.Errorf("status patch of content type %s", ct)
		}
		f.patches = append(f.patches, body)
		f.node.ResourceVersion = rv
		return http.StatusOK, f.node
	case r.Method == http.MethodPatch && r.URL.Path == nodePath:
		if f.node == nil {
			return http.StatusNotFound, nil
		}
		var p struct {
			Metadata struct{ Labels map[string]string }
		}
		if err := json.Unmarshal(body, &p); err != nil {
			return http.StatusBadRequest, nil
		}
		if f.node.Labels == nil {
			f.node.Labels = map[string]string{}
		}
		for k, v := range p.Metadata.Labels {
			f.node.Labels[k] = v
		}
		f.node.ResourceVersion = rv
		return http.StatusOK, f.node
	case r.Method == http.MethodGet && r.URL.Path == leasePath:
		if f.lease == nil {
			return http.StatusNotFound, nil
		}
		return http.StatusOK, f.lease
	case r.Method == http.MethodPost && r.URL.Path == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases":
		var l *coordv1.Lease
		if !decode(&l) {
			return http.StatusBadRequest, nil
		}
		if f.lease != nil {
			return http.StatusConflict, nil
		}
		l.UID, l.ResourceVersion, l.TypeMeta = types.UID("lease-"+rv), rv, metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}
		f.lease = l
		return http.StatusCreated, l
	case r.Method == http.MethodPut && r.URL.Path == leasePath:
		var l *coordv1.Lease
		if !decode(&l) {
			return http.StatusBadRequest, nil
		}
		if f.lease == nil {
			// The API server would create it, but the UID the update
			// carries is a precondition that fails.
			if l.UID != "" {
				return http.StatusConflict, nil
			}
			return http.StatusNotFound, nil
		}
		if l.ResourceVersion != f.lease.ResourceVersion {
			return http.StatusConflict, nil
		}
		l.ResourceVersion, l.TypeMeta = rv, metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}
		f.lease = l
		return http.StatusOK, l
	}
	f.t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
	return http.StatusNotFound, nil
}

// ndFacts is a NodeFacts source a test can change.
type ndFacts struct {
	mu sync.Mutex
	f  NodeFacts
}

func newNDFacts() *ndFacts {
	return &ndFacts{f: NodeFacts{Labels: map[string]string{"outpost.io/board": "raspberry-pi-4-model-b"}, Status: ndStatus()}}
}

func (n *ndFacts) get() NodeFacts {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeFacts{Labels: n.f.Labels, Status: *n.f.Status.DeepCopy()}
}

func (n *ndFacts) change(fn func(*NodeFacts)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fn(&n.f)
}

// ndLog records log messages.
type ndLog struct {
	mu   sync.Mutex
	msgs []string // "message reason=..."
}

func (l *ndLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *ndLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *ndLog) WithGroup(string) slog.Handler            { return l }
func (l *ndLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}

// matching returns the messages that start with prefix.
func (l *ndLog) matching(prefix string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			out = append(out, m)
		}
	}
	return out
}

const ndOffline = "api server not usable"

// ndSyncer returns a Syncer for node over cfg with facts, clk and a
// recording log.
func ndSyncer(t *testing.T, rc *rest.Config, kcfg Config, facts *ndFacts, clk clock.Clock) (*Syncer, *ndLog) {
	t.Helper()
	client, err := NewClient(rc, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: kcfg.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := &ndLog{}
	s, err := New(kcfg, Deps{Client: client, Store: st, NodeFacts: facts.get, Clock: clk, Log: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	return s, log
}

// ndConnectOnce runs the node loop of a Syncer made with cfg, its clock
// at at, until its link is up, then stops it: a node registering, or a
// bridge replica taking the node over.
func ndConnectOnce(t *testing.T, rc *rest.Config, cfg Config, at time.Time) {
	t.Helper()
	s, _ := ndSyncer(t, rc, cfg, newNDFacts(), &ndClock{Fake: clocktest.New(at)})
	stop := ndRun(t, s.runNode)
	spinWait.Until(t, "the link up at "+at.Format(time.TimeOnly), func() bool { return s.Link().Connected })
	stop()
}

// ndRun runs loop until the test ends.
func ndRun(t *testing.T, loop func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func ndFakeAPI(t *testing.T, name string) (*ndAPI, *rest.Config) {
	f := &ndAPI{t: t, name: name}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, &rest.Config{Host: srv.URL}
}

// Registration, then a Lease renewal per tick and a status patch only
// when the status changed or NodeStatusPeriod passed.
func TestNodeLoopSendsStatusOnChangeOrPeriod(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	clk := &ndClock{Fake: clocktest.New(ndEpoch)}
	facts := newNDFacts()
	s, _ := ndSyncer(t, rc, Config{NodeName: "n1", Labels: map[string]string{"site": "lab"}}, facts, clk)
	ndRun(t, s.runNode)

	spinWait.Until(t, "the link up", func() bool { return s.Link().Connected })
	want := []string{
		"GET /api/v1/nodes/n1 404", "POST /api/v1/nodes 201",
		"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 404",
		"POST /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases 201",
	}
	if got := api.log(0); !slices.Equal(got, want) {
		t.Fatalf("registration requests\n got %q\nwant %q", got, want)
	}
	api.mu.Lock()
	node, lease := api.node.DeepCopy(), api.lease.DeepCopy()
	api.mu.Unlock()
	if s.nodeUID() != node.UID || node.UID == "" {
		t.Errorf("nodeUID %q, want %q", s.nodeUID(), node.UID)
	}
	for k, v := range map[string]string{"kubernetes.io/arch": runtime.GOARCH, "kubernetes.io/os": "linux", "kubernetes.io/hostname": "n1", "outpost.io/board": "raspberry-pi-4-model-b", "site": "lab"} {
		if node.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, node.Labels[k], v)
		}
	}
	if c := ndCondition(node.Status, corev1.NodeReady); c.Status != corev1.ConditionTrue || !c.LastHeartbeatTime.Time.Equal(ndEpoch) {
		t.Errorf("created with Ready %+v", c)
	}
	if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != node.UID || lease.OwnerReferences[0].Kind != "Node" {
		t.Errorf("lease owners %+v, want the Node %s", lease.OwnerReferences, node.UID)
	}
	if !lease.Spec.RenewTime.Time.Equal(ndEpoch) || *lease.Spec.HolderIdentity != "n1" || *lease.Spec.LeaseDurationSeconds != 40 {
		t.Errorf("lease spec %+v", lease.Spec)
	}

	spinWait.Until(t, "the renewal ticker", func() bool { _, tk := clk.made(); return len(tk) == 1 })
	if _, tk := clk.made(); tk[0] != 10*time.Second {
		t.Fatalf("renewal every %s, want 10s", tk[0])
	}
	renewals := 0
	tick := func() {
		t.Helper()
		clk.Advance(10 * time.Second)
		renewals++
		spinWait.Until(t, fmt.Sprintf("renewal %d", renewals), func() bool {
			return api.count("PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200") == renewals
		})
	}
	for range 3 {
		tick()
	}
	if n := len(api.statusPatches()); n != 0 {
		t.Fatalf("%d status patches for heartbeats only, want 0", n)
	}

	facts.change(func(f *NodeFacts) {
		ndSetCondition(&f.Status, corev1.NodeMemoryPressure, corev1.ConditionTrue, "KubeletHasInsufficientMemory")
	})
	tick()
	patches := api.statusPatches()
	if len(patches) != 1 {
		t.Fatalf("%d status patches after a condition changed, want 1", len(patches))
	}
	var p struct{ Status corev1.NodeStatus }
	if err := json.Unmarshal(patches[0], &p); err != nil {
		t.Fatal(err)
	}
	changedAt := ndEpoch.Add(40 * time.Second)
	if c := ndCondition(p.Status, corev1.NodeMemoryPressure); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(changedAt) {
		t.Errorf("patched MemoryPressure %+v, want True since %v", c, changedAt)
	}
	if c := ndCondition(p.Status, corev1.NodeReady); !c.LastTransitionTime.Time.Equal(ndEpoch) || !c.LastHeartbeatTime.Time.Equal(changedAt) {
		t.Errorf("patched Ready %+v, want transition %v and heartbeat %v", c, ndEpoch, changedAt)
	}
	if len(p.Status.Capacity) != 0 {
		t.Errorf("patch resends the unchanged capacity: %s", patches[0])
	}

	for range 29 {
		tick()
	}
	if n := len(api.statusPatches()); n != 1 {
		t.Fatalf("%d status patches 4m50s after the last, want still 1", n)
	}
	tick()
	if n := len(api.statusPatches()); n != 2 {
		t.Fatalf("%d status patches 5m after the last, want 2", n)
	}
	if timers, _ := clk.made(); len(timers) != 0 {
		t.Errorf("timers %v while the link was up, want none", timers)
	}
}

// While the API server fails, connects are retried with the jittered
// reconnect backoff (1 s doubling to 2 min), not at the renewal period,
// and the failure is logged once; after the link comes back, the status
// goes before the Lease and only then is the node synced.
func TestNodeLoopBackoff(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	api.setFail(http.StatusServiceUnavailable)
	clk := &ndClock{Fake: clocktest.New(ndEpoch)}
	s, log := ndSyncer(t, rc, Config{NodeName: "n1"}, newNDFacts(), clk)
	ndRun(t, s.runNode)

	nextTimer := func(k int) time.Duration {
		t.Helper()
		spinWait.Until(t, fmt.Sprintf("retry timer %d", k+1), func() bool { tm, _ := clk.made(); return len(tm) == k+1 })
		tm, _ := clk.made()
		return tm[k]
	}
	checkBackoff := func(k int, d, ceil time.Duration) {
		t.Helper()
		if d < ceil/2 || d > ceil {
			t.Errorf("retry %d after %s, want within [%s, %s]", k+1, d, ceil/2, ceil)
		}
	}
	ceil := time.Second
	for k := range 9 {
		d := nextTimer(k)
		checkBackoff(k, d, ceil)
		if n := len(api.log(0)); n != k+1 {
			t.Fatalf("%d requests after %d failed connects, want one each", n, k+1)
		}
		if s.Link().Connected {
			t.Fatal("link up while the API server fails")
		}
		if k < 8 {
			clk.Advance(d)
		}
		ceil = min(2*ceil, 2*time.Minute)
	}
	if got := log.matching(ndOffline); len(got) != 1 || !strings.Contains(got[0], "503") {
		t.Errorf("offline logged %d times (%q), want once naming the 503", len(got), got)
	}
	if l := s.Link(); !strings.Contains(l.LastError, "get node n1") || l.LastErrorAt.IsZero() {
		t.Errorf("link %+v, want the last error recorded", l)
	}

	// The API server is back: the next retry connects.
	api.setFail(0)
	tm, _ := clk.made()
	clk.Advance(tm[8])
	spinWait.Until(t, "the link up", func() bool { return s.Link().Connected })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced after the link came up: %v", err)
	}
	spinWait.Until(t, "the renewal ticker", func() bool { _, tk := clk.made(); return len(tk) == 1 })

	// A failed renewal takes the link down, and the backoff starts again
	// from 1 s.
	api.setFail(http.StatusServiceUnavailable)
	clk.Advance(10 * time.Second)
	d := nextTimer(9)
	checkBackoff(9, d, time.Second)
	spinWait.Until(t, "the link down", func() bool { return !s.Link().Connected })
	if len(log.matching("api server unreachable")) != 1 {
		t.Errorf("the link going down was not logged once: %q", log.matching("api server"))
	}
	if got := log.matching(ndOffline); len(got) != 1 {
		t.Errorf("offline logged again after the transition was: %q", got)
	}

	// Back again 11 s later: the Node is read, and since it holds our
	// status with a recent heartbeat only the Lease is written (as kubelet
	// compares with the Node it reads); then synced.
	from := len(api.log(0))
	api.setFail(0)
	clk.Advance(d)
	spinWait.Until(t, "the link up again", func() bool { return s.Link().Connected })
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /api/v1/nodes/n1 200",
		"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
	}
	if got := api.log(from); !slices.Equal(got, want) {
		t.Errorf("reconnect requests\n got %q\nwant %q", got, want)
	}
}

// A renewal that conflicts reads the Lease and tries again at once.
func TestLeaseConflictRereads(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	clk := &ndClock{Fake: clocktest.New(ndEpoch)}
	s, _ := ndSyncer(t, rc, Config{NodeName: "n1", RenewInterval: 7 * time.Second, LeaseDuration: 25 * time.Second}, newNDFacts(), clk)
	ndRun(t, s.runNode)
	spinWait.Until(t, "the renewal ticker", func() bool { _, tk := clk.made(); return len(tk) == 1 })

	api.mu.Lock()
	api.lease.ResourceVersion = "999" // written by someone else
	api.lease.OwnerReferences = append(api.lease.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "cm"})
	api.mu.Unlock()
	from := len(api.log(0))
	clk.Advance(7 * time.Second)
	leasePath := "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
	spinWait.Until(t, "the renewal", func() bool { return api.count("PUT "+leasePath+" 200") == 1 })
	want := []string{"PUT " + leasePath + " 409", "GET " + leasePath + " 200", "PUT " + leasePath + " 200"}
	if got := api.log(from); !slices.Equal(got, want) {
		t.Errorf("requests\n got %q\nwant %q", got, want)
	}
	api.mu.Lock()
	l := api.lease.DeepCopy()
	api.mu.Unlock()
	if !l.Spec.RenewTime.Time.Equal(ndEpoch.Add(7*time.Second)) || *l.Spec.LeaseDurationSeconds != 25 {
		t.Errorf("lease spec %+v", l.Spec)
	}
	if len(l.OwnerReferences) != 2 || l.OwnerReferences[0].UID != s.nodeUID() || l.OwnerReferences[1].UID != "cm" {
		t.Errorf("lease owners %+v, want the Node's and the other kept", l.OwnerReferences)
	}
	if !s.Link().Connected {
		t.Error("link down after a conflict resolved")
	}
}

// A Lease found deleted (its Node was, and the garbage collector took
// the Lease with it) registers the Node again, then the Lease owned by it.
func TestLeaseGoneRegistersNodeAgain(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	clk := &ndClock{Fake: clocktest.New(ndEpoch)}
	s, _ := ndSyncer(t, rc, Config{NodeName: "n1"}, newNDFacts(), clk)
	ndRun(t, s.runNode)
	spinWait.Until(t, "the renewal ticker", func() bool { _, tk := clk.made(); return len(tk) == 1 })
	oldUID := s.nodeUID()
	if n, _ := s.forgottenCount(); n != 0 {
		t.Fatalf("first registration counted as the node forgotten %d times", n)
	}

	api.mu.Lock()
	api.node, api.lease = nil, nil
	api.mu.Unlock()
	from := len(api.log(0))
	clk.Advance(10 * time.Second)
	leases := "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
	spinWait.Until(t, "the Lease created again", func() bool { return api.count("POST "+leases+" 201") == 2 })
	want := []string{
		"PUT " + leases + "/n1 409", "GET " + leases + "/n1 404", "GET /api/v1/nodes/n1 404", "POST /api/v1/nodes 201",
		"GET " + leases + "/n1 404", "POST " + leases + " 201",
	}
	if got := api.log(from); !slices.Equal(got, want) {
		t.Errorf("requests\n got %q\nwant %q", got, want)
	}
	api.mu.Lock()
	node, lease := api.node.DeepCopy(), api.lease.DeepCopy()
	api.mu.Unlock()
	if node.UID == oldUID || s.nodeUID() != node.UID || lease.OwnerReferences[0].UID != node.UID {
		t.Errorf("node UID %s (was %s, syncer has %s), lease owner %s", node.UID, oldUID, s.nodeUID(), lease.OwnerReferences[0].UID)
	}
	spinWait.Until(t, "the link up", func() bool { return s.Link().Connected })
	// The watches relist and the sink looks for its mirror pods again.
	if n, _ := s.forgottenCount(); n != 1 {
		t.Errorf("node registered again: forgotten %d times, want 1", n)
	}
}

// A Node created by the first connect of a run that resumes an earlier
// one (a pods resume version in the store) means the API server lost it
// while the agent was stopped: rebuilt from an empty etcd, or the Node
// deleted. That counts as forgotten, so the pods watch relists rather
// than resume from a version the new server may not have; the first
// registration of a node that never synced does not.
func TestNodeCreatedAtResumeCountsAsForgotten(t *testing.T) {
	for _, resumed := range []bool{false, true} {
		t.Run(fmt.Sprint("resumed=", resumed), func(t *testing.T) {
			_, rc := ndFakeAPI(t, "n1")
			clk := &ndClock{Fake: clocktest.New(ndEpoch)}
			client, err := NewClient(rc, "outpost-test")
			if err != nil {
				t.Fatal(err)
			}
			st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if resumed {
				if err := st.SetResumeVersion(podsResource, "5000"); err != nil {
					t.Fatal(err)
				}
			}
			s, err := New(Config{NodeName: "n1"}, Deps{Client: client, Store: st, NodeFacts: newNDFacts().get, Clock: clk, Log: slog.New(&ndLog{})})
			if err != nil {
				t.Fatal(err)
			}
			ndRun(t, s.runNode)
			spinWait.Until(t, "the link up", func() bool { return s.Link().Connected })
			want := uint64(0)
			if resumed {
				want = 1
			}
			if n, _ := s.forgottenCount(); n != want {
				t.Errorf("forgotten %d times, want %d", n, want)
			}
		})
	}
}

// With nothing listening at the API server's address, the node loop
// keeps retrying and logs why once; Run neither fails nor blocks, and
// returns when its context ends.
func TestNodeOfflineUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rc := &rest.Config{Host: "https://" + addr}
	var tries atomic.Int32
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return ndRoundTrip(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/api/v1/nodes/n1" {
				tries.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})

	t.Run("node loop", func(t *testing.T) {
		tries.Store(0)
		clk := &ndClock{Fake: clocktest.New(ndEpoch)}
		s, log := ndSyncer(t, rc, Config{NodeName: "n1"}, newNDFacts(), clk)
		stop := ndRun(t, s.runNode)
		for k := range 5 {
			spinWait.Until(t, fmt.Sprintf("retry timer %d", k+1), func() bool { tm, _ := clk.made(); return len(tm) == k+1 })
			if n := tries.Load(); n != int32(k+1) {
				t.Fatalf("%d connects, want %d", n, k+1)
			}
			tm, _ := clk.made()
			clk.Advance(tm[k])
		}
		stop()
		if got := log.matching(ndOffline); len(got) != 1 || !strings.Contains(got[0], "unreachable") || !strings.Contains(got[0], "connection refused") {
			t.Errorf("offline logs %q, want one saying unreachable: connection refused", got)
		}
		if l := s.Link(); l.Connected || !strings.Contains(l.LastError, "connection refused") {
			t.Errorf("link %+v, want down with the error", l)
		}
	})

	t.Run("Run", func(t *testing.T) {
		tries.Store(0)
		s, _ := ndSyncer(t, rc, Config{NodeName: "n1"}, newNDFacts(), clocktest.New(ndEpoch))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		spinWait.Until(t, "a connect", func() bool { return tries.Load() >= 1 && s.Link().LastError != "" })
		select {
		case err := <-done:
			t.Fatalf("Run returned %v while its context lasts", err)
		default:
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
}

type ndRoundTrip func(*http.Request) (*http.Response, error)

func (f ndRoundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ---- integration tests against a real API server ----

// ndCluster is a real API server with an admin client.
type ndCluster struct {
	api   *env.APIServer
	admin *Client
}

func (c *ndCluster) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := c.admin.Core.Get().Resource("nodes").Name(name).Do(context.Background()).Into(&n); err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return &n
}

func (c *ndCluster) lease(name string) (*coordv1.Lease, error) {
	var l coordv1.Lease
	err := c.admin.Coordination.Get().Namespace("kube-node-lease").Resource("leases").Name(name).Do(context.Background()).Into(&l)
	return &l, err
}

// nodeConfig is the REST config of node's own identity.
func (c *ndCluster) nodeConfig(t *testing.T, name string) *rest.Config {
	t.Helper()
	rc, err := LoadKubeconfig(c.api.NodeKubeconfig(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// ndFast are short intervals for a real clock.
func ndFast(name string) Config {
	return Config{NodeName: name, RenewInterval: time.Second, LeaseDuration: 5 * time.Second}
}

func TestNodeAPIServer(t *testing.T) {
	api := env.StartAPIServer(t)
	admin, err := NewClient(api.Config, "outpost-test-admin")
	if err != nil {
		t.Fatal(err)
	}
	c := &ndCluster{api: api, admin: admin}
	t.Run("registers", func(t *testing.T) { ndTestRegisters(t, c) })
	t.Run("existing node", func(t *testing.T) { ndTestExisting(t, c) })
	t.Run("registers again after deletion", func(t *testing.T) { ndTestReregisters(t, c) })
	t.Run("credential rejected", func(t *testing.T) { ndTestRejected(t, c) })
	t.Run("outage and reconnect", func(t *testing.T) { ndTestOutage(t, c) })
}

// The Node appears with its labels, taints, capacity, conditions,
// addresses and nodeInfo; the Lease with the Node as owner and a renewTime
// that advances; the Node is not written again while nothing changes, and
// is when a condition does.
func ndTestRegisters(t *testing.T, c *ndCluster) {
	const name = "edge-reg"
	cfg := ndFast(name)
	cfg.Labels = map[string]string{"outpost.io/site": "lab", "node-role.kubernetes.io/edge": "", "node.kubernetes.io/edge": "true"}
	cfg.Taints = []corev1.Taint{{Key: "outpost.io/edge", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	facts := newNDFacts()
	s, log := ndSyncer(t, c.nodeConfig(t, name), cfg, facts, clock.Real{})
	start := time.Now().Truncate(time.Second)
	ndRun(t, s.runNode)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced: %v (link %+v)", err, s.Link())
	}
	n := c.node(t, name)
	for k, v := range map[string]string{
		"kubernetes.io/arch": runtime.GOARCH, "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
		"outpost.io/board": "raspberry-pi-4-model-b", "outpost.io/site": "lab", "node.kubernetes.io/edge": "true",
	} {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}
	if _, ok := n.Labels["node-role.kubernetes.io/edge"]; ok {
		t.Error("node-role.kubernetes.io/edge set; NodeRestriction forbids it and it should have been skipped")
	}
	if got := log.matching("node labels a node may not set"); len(got) != 1 || !strings.Contains(got[0], "node-role.kubernetes.io/edge") {
		t.Errorf("skipped label logs %q", got)
	}
	// The TaintNodesByCondition admission plugin adds not-ready beside ours.
	if !slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.MatchTaint(&cfg.Taints[0]) && tn.Value == "true" }) {
		t.Errorf("taints %+v, want %+v among them", n.Spec.Taints, cfg.Taints[0])
	}
	want := ndStatus()
	for _, r := range []corev1.ResourceName{"cpu", "memory", "pods", "ephemeral-storage"} {
		if got, w := n.Status.Capacity[r], want.Capacity[r]; got.Cmp(w) != 0 {
			t.Errorf("capacity %s = %s, want %s", r, got.String(), w.String())
		}
		if got, w := n.Status.Allocatable[r], want.Allocatable[r]; got.Cmp(w) != 0 {
			t.Errorf("allocatable %s = %s, want %s", r, got.String(), w.String())
		}
	}
	for _, w := range want.Conditions {
		got := ndCondition(n.Status, w.Type)
		if got.Status != w.Status || got.Reason != w.Reason || got.Message != w.Message {
			t.Errorf("condition %s = %+v, want %+v", w.Type, got, w)
		}
		if got.LastHeartbeatTime.Time.Before(start) || got.LastTransitionTime.Time.Before(start) {
			t.Errorf("condition %s times %v/%v, want since %v", w.Type, got.LastHeartbeatTime, got.LastTransitionTime, start)
		}
	}
	wantInfo := want.NodeInfo
	wantInfo.KubeletVersion = kubeletVersion
	if n.Status.NodeInfo != wantInfo {
		t.Errorf("nodeInfo\n got %+v\nwant %+v", n.Status.NodeInfo, wantInfo)
	}
	if !slices.Equal(n.Status.Addresses, want.Addresses) {
		t.Errorf("addresses %+v, want %+v", n.Status.Addresses, want.Addresses)
	}
	if n.Status.DaemonEndpoints.KubeletEndpoint.Port != 10250 {
		t.Errorf("daemonEndpoints %+v", n.Status.DaemonEndpoints)
	}
	if s.nodeUID() != n.UID {
		t.Errorf("nodeUID %q, want %q", s.nodeUID(), n.UID)
	}

	l, err := c.lease(name)
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	wantOwner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: name, UID: n.UID}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0] != wantOwner {
		t.Errorf("lease owners %+v, want %+v", l.OwnerReferences, wantOwner)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 5 {
		t.Errorf("lease spec %+v", l.Spec)
	}
	first := l.Spec.RenewTime.Time
	var renewals []time.Time
	apiWait.Until(t, "two more renewals", func() bool {
		l, err := c.lease(name)
		if err == nil && (len(renewals) == 0 || l.Spec.RenewTime.After(renewals[len(renewals)-1])) && l.Spec.RenewTime.After(first) {
			renewals = append(renewals, l.Spec.RenewTime.Time)
		}
		return len(renewals) >= 2
	})
	if !s.Link().Connected || s.Link().LastLease.IsZero() {
		t.Errorf("link %+v, want connected", s.Link())
	}
	if rv := c.node(t, name).ResourceVersion; rv != n.ResourceVersion {
		t.Errorf("node written while nothing changed (resourceVersion %s, was %s): the status must not be sent every renewal", rv, n.ResourceVersion)
	}

	facts.change(func(f *NodeFacts) {
		ndSetCondition(&f.Status, corev1.NodeMemoryPressure, corev1.ConditionTrue, "KubeletHasInsufficientMemory")
	})
	changed := time.Now().Truncate(time.Second)
	apiWait.Until(t, "MemoryPressure True on the Node", func() bool {
		return ndCondition(c.node(t, name).Status, corev1.NodeMemoryPressure).Status == corev1.ConditionTrue
	})
	n2 := c.node(t, name)
	if mp := ndCondition(n2.Status, corev1.NodeMemoryPressure); mp.LastTransitionTime.Time.Before(changed) || mp.Reason != "KubeletHasInsufficientMemory" {
		t.Errorf("MemoryPressure %+v, want a transition since %v", mp, changed)
	}
	if r1, r2 := ndCondition(n.Status, corev1.NodeReady), ndCondition(n2.Status, corev1.NodeReady); !r2.LastTransitionTime.Equal(&r1.LastTransitionTime) {
		t.Errorf("Ready transition moved from %v to %v without a change", r1.LastTransitionTime, r2.LastTransitionTime)
	}
}

// A Node that exists keeps its labels, UID and others' conditions; ours
// are merged in, and an unchanged condition keeps its transition time.
func ndTestExisting(t *testing.T, c *ndCluster) {
	const name = "edge-old"
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	pre := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": "a", "kubernetes.io/arch": "s390x", "node-role.kubernetes.io/edge": ""}},
	}
	var created corev1.Node
	if err := c.admin.Core.Post().Resource("nodes").Body(pre).Do(context.Background()).Into(&created); err != nil {
		t.Fatal(err)
	}
	created.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: old, LastTransitionTime: old},
		{Type: "KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock", LastHeartbeatTime: old, LastTransitionTime: old},
	}
	if err := c.admin.Core.Put().Resource("nodes").Name(name).SubResource("status").Body(&created).Do(context.Background()).Into(&created); err != nil {
		t.Fatal(err)
	}

	s, _ := ndSyncer(t, c.nodeConfig(t, name), ndFast(name), newNDFacts(), clock.Real{})
	ndRun(t, s.runNode)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced: %v (link %+v)", err, s.Link())
	}
	n := c.node(t, name)
	if n.UID != created.UID || s.nodeUID() != created.UID {
		t.Errorf("UID %s (syncer %s), want the existing %s", n.UID, s.nodeUID(), created.UID)
	}
	for k, v := range map[string]string{"team": "a", "kubernetes.io/arch": runtime.GOARCH, "outpost.io/board": "raspberry-pi-4-model-b", "node-role.kubernetes.io/edge": ""} {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}
	if r := ndCondition(n.Status, corev1.NodeReady); !r.LastTransitionTime.Equal(&old) || !r.LastHeartbeatTime.After(old.Time) {
		t.Errorf("Ready %+v, want transition %v kept and a new heartbeat", r, old)
	}
	if k := ndCondition(n.Status, "KernelDeadlock"); k.Status != corev1.ConditionFalse || !k.LastHeartbeatTime.Equal(&old) {
		t.Errorf("another's condition %+v, want it untouched", k)
	}
	if ndCondition(n.Status, corev1.NodePIDPressure).Status != corev1.ConditionFalse {
		t.Errorf("our PIDPressure not merged in: %+v", n.Status.Conditions)
	}
	if n.Status.Capacity.Cpu().Value() != 4 {
		t.Errorf("capacity %v", n.Status.Capacity)
	}
}

// When the Node and its Lease are deleted (as the garbage collector
// deletes the Lease with its owner), both come back, the Lease owned by
// the new Node.
func ndTestReregisters(t *testing.T, c *ndCluster) {
	const name = "edge-del"
	s, _ := ndSyncer(t, c.nodeConfig(t, name), ndFast(name), newNDFacts(), clock.Real{})
	ndRun(t, s.runNode)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced: %v", err)
	}
	oldUID := c.node(t, name).UID
	bg := context.Background()
	if err := c.admin.Core.Delete().Resource("nodes").Name(name).Do(bg).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.admin.Coordination.Delete().Namespace("kube-node-lease").Resource("leases").Name(name).Do(bg).Error(); err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	apiWait.Until(t, "the Node registered again", func() bool {
		err := c.admin.Core.Get().Resource("nodes").Name(name).Do(bg).Into(&n)
		return err == nil && n.UID != oldUID
	})
	apiWait.Until(t, "the Lease owned by the new Node", func() bool {
		l, err := c.lease(name)
		return err == nil && len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == n.UID
	})
	if s.nodeUID() != n.UID {
		t.Errorf("nodeUID %s, want the new %s", s.nodeUID(), n.UID)
	}
	if ndCondition(n.Status, corev1.NodeReady).Status != corev1.ConditionTrue || n.Status.Capacity.Cpu().Value() != 4 {
		t.Errorf("registered again without its status: %+v", n.Status)
	}
}

// A client certificate the API server does not trust: the agent stays
// offline, says why once, and keeps retrying.
func ndTestRejected(t *testing.T, c *ndCluster) {
	const name = "edge-rejected"
	other, err := env.NewCA("not-the-cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := other.Issue(pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := c.nodeConfig(t, name)
	rc.TLSClientConfig.CertData, rc.TLSClientConfig.KeyData = certPEM, keyPEM
	rc.TLSClientConfig.CertFile, rc.TLSClientConfig.KeyFile = "", ""
	s, log := ndSyncer(t, rc, ndFast(name), newNDFacts(), clock.Real{})
	ndRun(t, s.runNode)

	var seen []time.Time
	apiWait.Until(t, "three failed connects", func() bool {
		if at := s.Link().LastErrorAt; !at.IsZero() && (len(seen) == 0 || at.After(seen[len(seen)-1])) {
			seen = append(seen, at)
		}
		return len(seen) >= 3
	})
	if l := s.Link(); l.Connected || !strings.Contains(l.LastError, "Unauthorized") {
		t.Errorf("link %+v, want down and Unauthorized", l)
	}
	if got := log.matching(ndOffline); len(got) != 1 || !strings.Contains(got[0], "rejected the credential") {
		t.Errorf("offline logs %q, want one saying the credential was rejected", got)
	}
	var n corev1.Node
	if err := c.admin.Core.Get().Resource("nodes").Name(name).Do(context.Background()).Into(&n); !apierrors.IsNotFound(err) {
		t.Errorf("node %s exists (%v); a rejected credential must not register it", name, err)
	}
}

// The API server goes away: the link goes down (pods would keep
// running); it comes back: the link is up again, the status is written
// although unchanged, then the Lease, then the node is synced.
func ndTestOutage(t *testing.T, c *ndCluster) {
	const name = "edge-outage"
	target := strings.TrimPrefix(c.api.URL, "https://")
	p := startProxy(t, target)
	rc := c.nodeConfig(t, name)
	rc.Host = "https://" + p.addr
	s, log := ndSyncer(t, rc, ndFast(name), newNDFacts(), clock.Real{})
	ndRun(t, s.runNode)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced: %v", err)
	}

	p.cut()
	down := time.Now()
	apiWait.Until(t, "the link down", func() bool { return !s.Link().Connected })
	if d := time.Since(down); d > 10*time.Second {
		t.Errorf("link down noticed after %s", d)
	}
	if len(log.matching("api server unreachable")) != 1 {
		t.Errorf("link down logs %q", log.matching("api server"))
	}
	if ndSynced(s) {
		t.Error("node still synced with the link down")
	}

	// Outlast two retries, then come back.
	var seen []time.Time
	apiWait.Until(t, "two failed reconnects", func() bool {
		if at := s.Link().LastErrorAt; len(seen) == 0 || at.After(seen[len(seen)-1]) {
			seen = append(seen, at)
		}
		return len(seen) >= 3
	})
	back := time.Now().Truncate(time.Second)
	p.resume()
	if err := s.waitNodeSynced(ctx); err != nil {
		t.Fatalf("node not synced after the API server came back: %v (link %+v)", err, s.Link())
	}
	// The Node holds our unchanged status, from under NodeStatusPeriod
	// ago: only the Lease says the node is back.
	n := c.node(t, name)
	if r := ndCondition(n.Status, corev1.NodeReady); !r.LastHeartbeatTime.Time.Before(down.Truncate(time.Second).Add(time.Second)) {
		t.Errorf("Ready heartbeat %v: the unchanged status was written again on reconnect (link down at %v)", r.LastHeartbeatTime, down)
	}
	l, err := c.lease(name)
	if err != nil || l.Spec.RenewTime.Time.Before(back) {
		t.Errorf("lease %+v (%v), want renewed since %v", l.Spec, err, back)
	}
	if got := log.matching("api server reachable"); len(got) != 2 {
		t.Errorf("link up logs %q, want two (start and reconnect)", got)
	}
}

// ndSynced reports, without waiting, whether the node is synced.
func ndSynced(s *Syncer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.link.Connected && s.nodeSynced
}

// A node that goes away (the MQTT bridge saw its online flag turn false)
// has its Lease left alone until it is back; then the Lease is renewed
// again at once, without a reconnect backoff.
func TestAbsentNodeLeaseNotRenewed(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	clk := &ndClock{Fake: clocktest.New(ndEpoch)}
	s, _ := ndSyncer(t, rc, Config{NodeName: "n1"}, newNDFacts(), clk)
	ndRun(t, s.runNode)
	spinWait.Until(t, "the renewal ticker", func() bool { _, tk := clk.made(); return len(tk) == 1 })
	put := "PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200"
	clk.Advance(10 * time.Second)
	spinWait.Until(t, "a renewal", func() bool { return api.count(put) == 1 })

	s.SetPresent(false)
	spinWait.Until(t, "the link down", func() bool { return !s.Link().Connected })
	for range 6 {
		clk.Advance(10 * time.Second)
	}
	if n := api.count(put); n != 1 {
		t.Fatalf("%d renewals while the node was away, want still 1", n)
	}
	if ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond); s.waitNodeSynced(ctx) == nil {
		t.Error("the status sink may write while the node is away")
		cancel()
	} else {
		cancel()
	}

	s.SetPresent(true)
	spinWait.Until(t, "the link up again", func() bool { return s.Link().Connected })
	spinWait.Until(t, "the Lease renewed on return", func() bool { return api.count(put) == 2 })
	if timers, _ := clk.made(); len(timers) != 0 {
		t.Errorf("backoff timers %v on the way back, want none", timers)
	}
}

// TestNodeLoopLeaseFirst: a Syncer with LeaseFirst (a bridge replica
// taking a node over) renews the node's existing Lease before it reads
// the Node, keeping the Lease's owner; without a Lease it registers as
// any node does.
func TestNodeLoopLeaseFirst(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true}, ndEpoch)
	want := []string{
		"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 404",
		"GET /api/v1/nodes/n1 404", "POST /api/v1/nodes 201",
		"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 404",
		"POST /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases 201",
	}
	if got := api.log(0); !slices.Equal(got, want) {
		t.Fatalf("first registration\n got %q\nwant %q", got, want)
	}
	api.mu.Lock()
	owners := api.lease.DeepCopy().OwnerReferences
	from := len(api.requests)
	api.mu.Unlock()

	later := ndEpoch.Add(30 * time.Second)
	ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true}, later)
	got := api.log(from)
	want = []string{
		"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
		"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
		"GET /api/v1/nodes/n1 200",
	}
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) || slices.Contains(got[len(want):], want[1]) {
		t.Fatalf("take-over requests\n got %q\nwant %q first and no second renewal", got, want)
	}
	api.mu.Lock()
	lease := api.lease.DeepCopy()
	api.mu.Unlock()
	if !lease.Spec.RenewTime.Time.Equal(later) || !slices.Equal(lease.OwnerReferences, owners) {
		t.Errorf("lease renewed at %v with owners %+v, want %v and %+v", lease.Spec.RenewTime, lease.OwnerReferences, later, owners)
	}
}

// TestNodeLoopLeaseFirstFromListedLease: a Syncer given the node's Lease
// as listed (Config.Lease: a bridge replica lists the Leases of the
// nodes it takes over at once) renews it with no read before; a Lease
// that changed since it was listed is read and renewed.
func TestNodeLoopLeaseFirstFromListedLease(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true}, ndEpoch)

	for _, tc := range []struct {
		name    string
		changed bool
		want    []string
	}{
		{"as listed", false, []string{
			"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
			"GET /api/v1/nodes/n1 200",
		}},
		{"changed since", true, []string{
			"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 409",
			"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
			"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
			"GET /api/v1/nodes/n1 200",
		}},
	} {
		api.mu.Lock()
		listed := api.lease.DeepCopy()
		from := len(api.requests)
		api.mu.Unlock()
		if tc.changed {
			listed.ResourceVersion = "1" // older than the server's
		}
		later := ndEpoch.Add(30 * time.Second)
		ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true, Lease: listed}, later)
		got := api.log(from)
		if len(got) < len(tc.want) || !slices.Equal(got[:len(tc.want)], tc.want) {
			t.Errorf("%s: take-over requests\n got %q\nwant %q first", tc.name, got, tc.want)
		}
		api.mu.Lock()
		renewed := api.lease.Spec.RenewTime.Time
		api.mu.Unlock()
		if !renewed.Equal(later) {
			t.Errorf("%s: lease renewed at %v, want %v", tc.name, renewed, later)
		}
	}
}

func TestNodeLoopFromRenewedLease(t *testing.T) {
	api, rc := ndFakeAPI(t, "n1")
	ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true}, ndEpoch)

	api.mu.Lock()
	listed := api.lease.DeepCopy()
	from := len(api.requests)
	api.mu.Unlock()
	later := ndEpoch.Add(30 * time.Second)
	client, err := NewClient(rc, "outpost-test")
	if err != nil {
		t.Fatal(err)
	}
	got, err := RenewLease(context.Background(), client, listed, later)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.RenewTime == nil || !got.Spec.RenewTime.Time.Equal(later) || *got.Spec.HolderIdentity != "n1" || *got.Spec.LeaseDurationSeconds != 40 {
		t.Fatalf("renewed lease: %+v", got.Spec)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].Kind != "Node" {
		t.Errorf("renewed lease owners %v, want the Node's kept", got.OwnerReferences)
	}
	ndConnectOnce(t, rc, Config{NodeName: "n1", LeaseFirst: true, Lease: got, LeaseRenewed: true}, later.Add(time.Second))
	want := []string{
		"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1 200",
		"GET /api/v1/nodes/n1 200",
	}
	log := api.log(from)
	if len(log) < len(want) || !slices.Equal(log[:len(want)], want) {
		t.Errorf("take-over requests\n got %q\nwant %q first", log, want)
	}
	for _, r := range log[len(want):] {
		if strings.Contains(r, "/leases/") {
			t.Errorf("the lease renewed a moment ago was written again at connect: %q", log)
		}
	}

	// A renewal whose Lease changed since it was listed conflicts and
	// says so; the node's Syncer reads it then.
	stale := listed.DeepCopy()
	stale.ResourceVersion = "1"
	if _, err := RenewLease(context.Background(), client, stale, later); !apierrors.IsConflict(err) {
		t.Errorf("renewal of a stale lease: %v, want a conflict", err)
	}
}
