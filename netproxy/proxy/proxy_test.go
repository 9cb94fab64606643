package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/netproxy/servicemodel"
	"github.com/outpost-edge/outpost/store"
)

// The node of these tests: n1, pod CIDR 10.42.0.0/24, address
// 192.0.2.10; 10.42.1.0/24 is another node's pods.
const node = "n1"

var (
	podCIDR  = netip.MustParsePrefix("10.42.0.0/24")
	nodeIP   = netip.MustParseAddr("192.0.2.10")
	clientIP = netip.MustParseAddr("10.42.0.3") // a client pod on this node
	podAIP   = netip.MustParseAddr("10.42.0.5")
	podBIP   = netip.MustParseAddr("10.42.0.6")
	remoteIP = netip.MustParseAddr("10.42.1.7")
)

func ptr[T any](v T) *T { return &v }

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Check(); err != nil {
			t.Errorf("store check: %v", err)
		}
		st.Close()
	})
	return st
}

func put[T any, P interface {
	*T
	store.Object
}](t *testing.T, c store.Collection[T, P], src store.Source, obj P) {
	t.Helper()
	if err := c.Put(src, obj); err != nil {
		t.Fatal(err)
	}
}

// newPod returns a pod of namespace default labelled app=<app> whose one
// container has ports.
func newPod(name, app string, ports ...corev1.ContainerPort) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img", Ports: ports}}},
	}
}

// webService is a ClusterIP Service 10.96.0.10:80 -> app=web:8080.
func webService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector:  map[string]string{"app": "web"},
			ClusterIP: "10.96.0.10",
			Ports:     []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

var webIP = netip.MustParseAddr("10.96.0.10")

// agent is the agent's side of LocalPods and Changed.
type agent struct {
	mu      sync.Mutex
	pods    []servicemodel.LocalPod
	settled bool
	calls   int
	changed chan struct{}
}

func newAgent(settled bool) *agent {
	return &agent{settled: settled, changed: make(chan struct{}, 1)}
}

func (a *agent) LocalPods() ([]servicemodel.LocalPod, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	return slices.Clone(a.pods), a.settled
}

func (a *agent) notify() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// set makes pod (with address ip) known with readiness ready.
func (a *agent) set(pod *corev1.Pod, ip netip.Addr, ready bool) {
	a.mu.Lock()
	i := slices.IndexFunc(a.pods, func(lp servicemodel.LocalPod) bool { return lp.Pod.UID == pod.UID })
	lp := servicemodel.LocalPod{Pod: pod, IPs: []netip.Addr{ip}, Ready: ready}
	if i < 0 {
		a.pods = append(a.pods, lp)
	} else {
		a.pods[i] = lp
	}
	a.mu.Unlock()
	a.notify()
}

// drain takes a pending notification, so that Changed wakes Run only
// for what the test does next.
func (a *agent) drain() {
	select {
	case <-a.changed:
	default:
	}
}

func (a *agent) settle() {
	a.mu.Lock()
	a.settled = true
	a.mu.Unlock()
	a.notify()
}

func (a *agent) callCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func newProxy(t *testing.T, cfg Config, deps Deps) *Proxy {
	t.Helper()
	if cfg.Node == "" {
		cfg.Node = node
	}
	if !cfg.PodCIDR.IsValid() {
		cfg.PodCIDR = podCIDR
	}
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func isNode(a netip.Addr) bool { return a == nodeIP }

// dnats returns where the packet can be DNATed to, sorted ("accept" or
// "reject" for an outcome without DNAT).
func dnats(t *testing.T, f *nfttest.Fake, p nfttest.Packet) []string {
	t.Helper()
	outs, err := f.Trace(p, isNode)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range outs {
		switch {
		case o.DNAT.IsValid():
			got = append(got, o.DNAT.String())
		case o.Rejected:
			got = append(got, "reject")
		default:
			got = append(got, "accept")
		}
	}
	slices.Sort(got)
	return got
}

func tcp(src, dst netip.Addr, port uint16) nfttest.Packet {
	return nfttest.Packet{Src: src, Dst: dst, Protocol: "TCP", Port: port}
}

func checkDNATs(t *testing.T, what string, f *nfttest.Fake, p nfttest.Packet, want ...string) {
	t.Helper()
	if got := dnats(t, f, p); !slices.Equal(got, want) {
		t.Errorf("%s: %s %s -> %s:%d goes to %q, want %q", what, p.Protocol, p.Src, p.Dst, p.Port, got, want)
	}
}

func mustSync(t *testing.T, p *Proxy) {
	t.Helper()
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncStandalone: a standalone Service's endpoints are the local pods
// its selector matches, ready as LocalPods says; Stats counts.
func TestSyncStandalone(t *testing.T) {
	st := openStore(t)
	a, b := newPod("web-a", "web"), newPod("web-b", "web")
	other := newPod("db", "db")
	put(t, st.Services(), store.SourceStatic, webService())
	for _, p := range []*corev1.Pod{a, b, other} {
		put(t, st.Pods(), store.SourceStatic, p)
	}
	ag := newAgent(true)
	ag.set(a, podAIP, true)
	ag.set(b, podBIP, true)
	ag.set(other, netip.MustParseAddr("10.42.0.9"), true)
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods})

	mustSync(t, p)
	checkDNATs(t, "both ready", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080", "10.42.0.6:8080")

	ag.set(b, podBIP, false)
	mustSync(t, p)
	checkDNATs(t, "web-b not ready", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080")

	s := p.Stats()
	c, err := f.List()
	if err != nil {
		t.Fatal(err)
	}
	if s.Syncs != 2 || s.Failures != 0 || s.LastError != "" || s.Services != 1 || s.Chains != len(c.Chains) || s.Rules == 0 || s.Elements == 0 || s.LastOps == 0 {
		t.Errorf("Stats = %+v; want 2 syncs, no failure, 1 service, %d chains, some rules, elements and ops", s, len(c.Chains))
	}

	// Nothing changed: nothing applied.
	txs := f.Txs()
	mustSync(t, p)
	if s := p.Stats(); s.Syncs != 3 || s.LastOps != 0 || f.Txs() != txs {
		t.Errorf("a sync without change: %d ops, %d Txs; want none", s.LastOps, f.Txs()-txs)
	}
}

// TestSyncWithoutLocalPods: with no LocalPods, every stored pod with an
// address counts as ready; one without an address is no endpoint.
func TestSyncWithoutLocalPods(t *testing.T) {
	st := openStore(t)
	put(t, st.Services(), store.SourceStatic, webService())
	a, b := newPod("web-a", "web"), newPod("web-b", "web")
	put(t, st.Pods(), store.SourceStatic, a)
	put(t, st.Pods(), store.SourceStatic, b)
	if err := st.Reserve(podAIP.String(), string(a.UID)); err != nil {
		t.Fatal(err)
	}
	f := nfttest.NewFake()
	mustSync(t, newProxy(t, Config{}, Deps{Store: st, Ruleset: f}))
	checkDNATs(t, "one pod with an address", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080")
}

// apiService is the API server's Service api, 10.96.0.20:80 (port http).
func apiService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "api"},
		Spec: corev1.ServiceSpec{
			Selector:  map[string]string{"app": "api"}, // not used: the slices say
			ClusterIP: "10.96.0.20",
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}},
		},
	}
}

var apiIP = netip.MustParseAddr("10.96.0.20")

func sliceEndpoint(ip netip.Addr, nodeName string, ready bool, pod *corev1.Pod) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{ip.String()},
		NodeName:   ptr(nodeName),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
	}
	if pod != nil {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	}
	return e
}

func apiSlice(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "api-x1", Labels: map[string]string{discoveryv1.LabelServiceName: "api"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

// TestSyncAPIService: an API Service's endpoints are those of its
// EndpointSlices; an endpoint that is a local pod is as ready as
// LocalPods says, whatever the (possibly stale) slice says.
func TestSyncAPIService(t *testing.T) {
	st := openStore(t)
	local := newPod("api-a", "api")
	put(t, st.Services(), store.SourceAPI, apiService())
	put(t, st.Pods(), store.SourceAPI, local)
	// The slice still says the local pod is not ready.
	put(t, st.EndpointSlices(), store.SourceAPI, apiSlice(
		sliceEndpoint(remoteIP, "n2", true, nil),
		sliceEndpoint(podAIP, node, false, local),
	))
	ag := newAgent(true)
	ag.set(local, podAIP, true)
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods})

	mustSync(t, p)
	checkDNATs(t, "local pod ready, slice says not", f, tcp(clientIP, apiIP, 80), "10.42.0.5:8080", "10.42.1.7:8080")

	ag.set(local, podAIP, false)
	put(t, st.EndpointSlices(), store.SourceAPI, apiSlice(
		sliceEndpoint(remoteIP, "n2", true, nil),
		sliceEndpoint(podAIP, node, true, local),
	))
	mustSync(t, p)
	checkDNATs(t, "local pod not ready, slice says ready", f, tcp(clientIP, apiIP, 80), "10.42.1.7:8080")

	// The remote endpoint goes from the slice; another comes.
	ag.set(local, podAIP, true)
	put(t, st.EndpointSlices(), store.SourceAPI, apiSlice(
		sliceEndpoint(netip.MustParseAddr("10.42.1.9"), "n2", true, nil),
		sliceEndpoint(podAIP, node, true, local),
	))
	mustSync(t, p)
	checkDNATs(t, "slice changed", f, tcp(clientIP, apiIP, 80), "10.42.0.5:8080", "10.42.1.9:8080")

	if _, err := st.EndpointSlices().Delete("default", "api-x1"); err != nil {
		t.Fatal(err)
	}
	mustSync(t, p)
	checkDNATs(t, "slice deleted", f, tcp(clientIP, apiIP, 80), "reject")
}

// TestSyncHostPorts: a stored pod's hostPorts are DNATed from the node's
// address to the address IPAM gave the pod, and go when it is released;
// a pod without an address, and a hostNetwork pod, get none.
func TestSyncHostPorts(t *testing.T) {
	st := openStore(t)
	hp := newPod("hp", "hp",
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30080, Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{ContainerPort: 53, HostPort: 30053, Protocol: corev1.ProtocolUDP, HostIP: nodeIP.String()},
		corev1.ContainerPort{ContainerPort: 9090}, // no hostPort
	)
	noAddr := newPod("noaddr", "x", corev1.ContainerPort{ContainerPort: 8081, HostPort: 30081})
	hostNet := newPod("hostnet", "x", corev1.ContainerPort{ContainerPort: 30082, HostPort: 30082})
	hostNet.Spec.HostNetwork = true
	for _, p := range []*corev1.Pod{hp, noAddr, hostNet} {
		put(t, st.Pods(), store.SourceStatic, p)
	}
	hpIP := netip.MustParseAddr("10.42.0.7")
	if err := st.Reserve(hpIP.String(), string(hp.UID)); err != nil {
		t.Fatal(err)
	}
	if err := st.Reserve(nodeIP.String(), string(hostNet.UID)); err != nil {
		t.Fatal(err)
	}
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f})
	mustSync(t, p)

	outside := netip.MustParseAddr("198.51.100.1")
	checkDNATs(t, "hostPort", f, tcp(outside, nodeIP, 30080), "10.42.0.7:8080")
	checkDNATs(t, "hostPort from the node", f, nfttest.Packet{Src: nodeIP, Dst: nodeIP, Protocol: "TCP", Port: 30080, Output: true}, "10.42.0.7:8080")
	checkDNATs(t, "UDP hostPort on the host IP", f, nfttest.Packet{Src: outside, Dst: nodeIP, Protocol: "UDP", Port: 30053}, "10.42.0.7:53")
	checkDNATs(t, "pod without an address", f, tcp(outside, nodeIP, 30081), "accept")
	checkDNATs(t, "hostNetwork pod", f, tcp(outside, nodeIP, 30082), "accept")
	checkDNATs(t, "not the node's address", f, tcp(outside, netip.MustParseAddr("192.0.2.99"), 30080), "accept")

	if _, err := st.Release(string(hp.UID)); err != nil {
		t.Fatal(err)
	}
	mustSync(t, p)
	checkDNATs(t, "address released", f, tcp(outside, nodeIP, 30080), "accept")
}

// TestSyncBadHostPortKeepsServices (regression: one pod's hostPort with a
// host IP of the other family than its address, which neither the API
// server nor static pod validation refuses, failed every sync and left
// the node with no Services): a hostPort the table cannot render is
// skipped, and the rest is applied.
func TestSyncBadHostPortKeepsServices(t *testing.T) {
	st := openStore(t)
	put(t, st.Services(), store.SourceStatic, webService())
	a := newPod("web-a", "web",
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30080, HostIP: "2001:db8::10"},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30081, HostIP: "not-an-ip"},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30083, Protocol: "ICMP"},
		corev1.ContainerPort{HostPort: 30084},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30085, HostIP: "::"}, // any, as 0.0.0.0
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 30082},
	)
	put(t, st.Pods(), store.SourceStatic, a)
	if err := st.Reserve(podAIP.String(), string(a.UID)); err != nil {
		t.Fatal(err)
	}
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f})
	if err := p.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	checkDNATs(t, "service", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080")
	checkDNATs(t, "good hostPort", f, tcp(netip.MustParseAddr("198.51.100.1"), nodeIP, 30082), "10.42.0.5:8080")
	checkDNATs(t, "hostPort on ::", f, tcp(netip.MustParseAddr("198.51.100.1"), nodeIP, 30085), "10.42.0.5:8080")
	// A host IP that does not parse must not widen the port to every
	// address.
	checkDNATs(t, "hostPort with a bad host IP", f, tcp(netip.MustParseAddr("198.51.100.1"), nodeIP, 30081), "accept")
}

// eventually polls cond every millisecond until it holds, calling step
// (if any, to move a fake clock) between looks, or fails the test after
// 10 s.
func eventually(t *testing.T, what string, step func(), cond func() bool) {
	t.Helper()
	waittest.Poll{Timeout: 10 * time.Second, Every: time.Millisecond, Between: step}.Until(t, what, cond)
}

// run starts p.Run and returns a function that cancels it and waits for
// it to return (also called when the test ends).
func run(t *testing.T, p *Proxy) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newService(name, clusterIP string) *corev1.Service {
	s := webService()
	s.Name, s.Spec.ClusterIP = name, clusterIP
	return s
}

// TestRun: Run syncs at start, applies a store change and a readiness
// change, turns a burst of changes into few syncs, and returns when its
// context ends.
func TestRun(t *testing.T) {
	st := openStore(t)
	a, b := newPod("web-a", "web"), newPod("web-b", "web")
	put(t, st.Services(), store.SourceStatic, webService())
	ag := newAgent(true)
	ag.set(a, podAIP, true)
	ag.set(b, podBIP, true)
	clk := clocktest.New(time.Unix(1000, 0))
	f := nfttest.NewFake()
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods, Changed: ag.changed, Clock: clk})
	stop := run(t, p)
	step := func() { clk.Advance(DefaultMinSyncInterval) }

	eventually(t, "the first sync", nil, func() bool { return p.Stats().Syncs == 1 })
	checkDNATs(t, "at start", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080", "10.42.0.6:8080")

	put(t, st.Services(), store.SourceStatic, newService("new", "10.96.0.11"))
	eventually(t, "the new Service", step, func() bool { return p.Stats().Services == 2 })
	checkDNATs(t, "new Service", f, tcp(clientIP, netip.MustParseAddr("10.96.0.11"), 80), "10.42.0.5:8080", "10.42.0.6:8080")

	ag.set(b, podBIP, false)
	eventually(t, "web-b to go", step, func() bool {
		return slices.Equal(dnats(t, f, tcp(clientIP, webIP, 80)), []string{"10.42.0.5:8080"})
	})

	before := p.Stats().Syncs
	const burst = 50
	for i := range burst {
		put(t, st.Services(), store.SourceStatic, newService(fmt.Sprintf("burst%d", i), netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}).String()))
	}
	eventually(t, "the burst", step, func() bool { return p.Stats().Services == 2+burst })
	if n := p.Stats().Syncs - before; n >= 10 {
		t.Errorf("%d changes took %d syncs, want them coalesced into a few", burst, n)
	}

	stop()
	syncs := p.Stats().Syncs
	put(t, st.Services(), store.SourceStatic, newService("late", "10.96.0.12"))
	clk.Advance(time.Minute)
	if got := p.Stats().Syncs; got != syncs {
		t.Errorf("synced %d times after Run returned", got-syncs)
	}
}

var _ Ruleset = (*nfttest.Fake)(nil)

// flaky is a Fake whose failAt-th Apply fails (and changes nothing).
type flaky struct {
	*nfttest.Fake
	mu      sync.Mutex
	applies int
	failAt  int
}

func (r *flaky) Apply(tx *nft.Tx) error {
	r.mu.Lock()
	r.applies++
	fail := r.applies == r.failAt
	r.mu.Unlock()
	if fail {
		return errors.New("injected failure")
	}
	return r.Fake.Apply(tx)
}

// TestRunRetries: a failed sync is tried again retryInterval later,
// without another change, in full, and leaves the table as a fresh
// proxy's full sync does.
func TestRunRetries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failAt int
	}{
		{"first apply", 1},
		{"incremental apply", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := openStore(t)
			a := newPod("web-a", "web")
			put(t, st.Services(), store.SourceStatic, webService())
			ag := newAgent(true)
			ag.set(a, podAIP, true)
			ag.drain()
			clk := clocktest.New(time.Unix(1000, 0))
			rs := &flaky{Fake: nfttest.NewFake(), failAt: tc.failAt}
			p := newProxy(t, Config{}, Deps{Store: st, Ruleset: rs, LocalPods: ag.LocalPods, Changed: ag.changed, Clock: clk})
			run(t, p)
			step := func() { clk.Advance(10 * time.Millisecond) }

			if tc.failAt == 2 {
				eventually(t, "the first sync", nil, func() bool { return p.Stats().Syncs == 1 })
				put(t, st.Services(), store.SourceStatic, newService("new", "10.96.0.11"))
			}
			eventually(t, "the failure", step, func() bool { return p.Stats().Failures == 1 })
			failed := p.Stats()
			if !strings.Contains(failed.LastError, "injected failure") {
				t.Errorf("LastError = %q", failed.LastError)
			}
			eventually(t, "the retry", step, func() bool { return p.Stats().Syncs == failed.Syncs+1 })
			s := p.Stats()
			if s.Failures != 1 || s.LastError != "" {
				t.Errorf("after the retry: %d failures, last error %q; want 1, none", s.Failures, s.LastError)
			}
			if d := s.Last.Sub(failed.Last); d < retryInterval {
				t.Errorf("retried %s after the failure, want %s", d, retryInterval)
			}
			if !slices.ContainsFunc(rs.Last(), func(op nft.Op) bool { return op.Kind == nft.OpAddMap }) {
				t.Errorf("the retry was not a full sync: %d ops", len(rs.Last()))
			}
			fresh := nfttest.NewFake()
			mustSync(t, newProxy(t, Config{}, Deps{Store: st, Ruleset: fresh, LocalPods: ag.LocalPods}))
			if got, want := rs.Dump(), fresh.Dump(); got != want {
				t.Errorf("after the retry the table is\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestRunSettle: after an agent restart (the table of the earlier run is
// in the kernel) the first sync waits until the agent knows its pods'
// readiness, or SettleTimeout; with an empty table it does not wait.
func TestRunSettle(t *testing.T) {
	a, b := newPod("web-a", "web"), newPod("web-b", "web")
	// prior returns a store and a Fake holding what the earlier run
	// applied: web with both pods ready.
	prior := func(t *testing.T) (*store.Store, *nfttest.Fake) {
		st := openStore(t)
		put(t, st.Services(), store.SourceStatic, webService())
		ag := newAgent(true)
		ag.set(a, podAIP, true)
		ag.set(b, podBIP, true)
		f := nfttest.NewFake()
		mustSync(t, newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods}))
		return st, f
	}

	t.Run("waits for the agent", func(t *testing.T) {
		st, f := prior(t)
		before := f.Dump()
		ag := newAgent(false) // knows no pod yet
		clk := clocktest.New(time.Unix(1000, 0))
		p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods, Changed: ag.changed, Clock: clk})
		run(t, p)
		// A store change does not end the wait either.
		put(t, st.Services(), store.SourceStatic, newService("new", "10.96.0.11"))
		// Run asks again on every tick (a sync would ask only once).
		eventually(t, "Run to ask the agent a few times", func() { clk.Advance(250 * time.Millisecond) },
			func() bool { return ag.callCount() >= 4 })
		if s := p.Stats(); s.Syncs != 0 {
			t.Fatalf("synced %d times before the agent settled", s.Syncs)
		}
		if got := f.Dump(); got != before {
			t.Errorf("the table changed before the agent settled:\n%s", got)
		}
		checkDNATs(t, "before the agent settled", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080", "10.42.0.6:8080")

		ag.set(a, podAIP, true)
		ag.set(b, podBIP, false)
		ag.settle()
		eventually(t, "the first sync", nil, func() bool { return p.Stats().Syncs == 1 })
		checkDNATs(t, "after the agent settled", f, tcp(clientIP, webIP, 80), "10.42.0.5:8080")
	})

	t.Run("until SettleTimeout", func(t *testing.T) {
		st, f := prior(t)
		ag := newAgent(false)
		clk := clocktest.New(time.Unix(1000, 0))
		start := clk.Now()
		p := newProxy(t, Config{SettleTimeout: 5 * time.Second}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods, Changed: ag.changed, Clock: clk})
		run(t, p)
		eventually(t, "the sync after SettleTimeout", func() { clk.Advance(250 * time.Millisecond) },
			func() bool { return p.Stats().Syncs == 1 })
		if d := p.Stats().Last.Sub(start); d < 5*time.Second {
			t.Errorf("synced %s after start, want SettleTimeout (5s)", d)
		}
	})

	t.Run("empty table: at once", func(t *testing.T) {
		st, _ := prior(t)
		ag := newAgent(false)
		f := nfttest.NewFake()
		p := newProxy(t, Config{}, Deps{Store: st, Ruleset: f, LocalPods: ag.LocalPods, Changed: ag.changed, Clock: clocktest.New(time.Unix(1000, 0))})
		run(t, p)
		// The clock never moves: only a sync that does not wait happens.
		eventually(t, "the first sync", nil, func() bool { return p.Stats().Syncs == 1 })
	})
}

// TestNewErrors: New refuses a config without node, pod CIDR, store or
// ruleset.
func TestNewErrors(t *testing.T) {
	st := openStore(t)
	f := nfttest.NewFake()
	for _, tc := range []struct {
		name string
		cfg  Config
		deps Deps
	}{
		{"no node", Config{PodCIDR: podCIDR}, Deps{Store: st, Ruleset: f}},
		{"no pod CIDR", Config{Node: node}, Deps{Store: st, Ruleset: f}},
		{"no store", Config{Node: node, PodCIDR: podCIDR}, Deps{Ruleset: f}},
		{"no ruleset", Config{Node: node, PodCIDR: podCIDR}, Deps{Store: st}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg, tc.deps); err == nil {
				t.Error("New succeeded")
			}
		})
	}
}
