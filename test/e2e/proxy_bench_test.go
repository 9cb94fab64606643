package e2e

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/netproxy/proxy"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

// The service proxy benchmark's workload: N ClusterIP Services in one
// namespace, one TCP port each, with one EndpointSlice of five ready
// endpoints (two of them on the proxy's node), written directly as admin
// (no controller manager runs).
const (
	pbNode      = "bench-node"
	pbNamespace = "bench"
	pbEndpoints = 5
	// pbServiceCIDR holds the Services' cluster IPs: the test API server's
	// own range (a /24) is too small, so the benchmark adds a ServiceCIDR.
	pbServiceCIDR = "10.96.0.0/16"
	// pbExtra is the index of the first Service added, changed and
	// deleted after the cold sync (pbReps of them per size); the
	// workload's own indexes stay below it.
	pbExtra = 60000
	// pbProbe is the index of the Service that checks the ServiceCIDR is
	// in use.
	pbProbe = 65000
	// pbReps is how many times each of add, change and delete is
	// measured per size (the median is reported).
	pbReps = 5
	// pbOutpostRounds is how many times outpost goes through the pbReps
	// changes: its syncs take a fraction of a millisecond, where a page
	// fault or a collection in the benchmark's process moves one by as
	// much, so it takes more samples than kube-proxy (whose changes each
	// wait out its sync period) for a median as steady.
	pbOutpostRounds = 5
	// pbPodCIDR is outpost's node pod range (the agent's default);
	// pbClusterCIDR is kube-proxy's --cluster-cidr.
	pbPodCIDR     = "10.42.0.0/24"
	pbClusterCIDR = "10.42.0.0/16"
	// pbMetrics is where kube-proxy serves its metrics, inside its own
	// network namespace.
	pbMetrics = "127.0.0.1:10249"
	// pbSettle is how long kube-proxy's sync count must stay still for its
	// syncs after a change to be over: more than its minSyncPeriod (1 s).
	pbSettle = 2500 * time.Millisecond
	// pbColdTimeout bounds kube-proxy's first full sync.
	pbColdTimeout = 30 * time.Minute
	// pbRSSTableTimeout bounds the wait for the agent's table to hold
	// every Service.
	pbRSSTableTimeout = 10 * time.Minute
)

// pbOps are the one-Service changes measured after the cold sync.
var pbOps = []string{"add", "change", "delete"}

// pbMemFields are the /proc status fields read of kube-proxy.
var pbMemFields = []string{"VmRSS", "RssAnon", "RssFile"}

// BenchmarkProxyVsKubeProxy measures outpost's service proxy against
// upstream kube-proxy in nftables mode, on the same Services, on the same
// machine, in the same run. For each size N (100, 1000 and 10000 Services
// × 5 endpoints; OUTPOST_BENCH_PROXY_SIZES=N,N,… for others) it creates
// the Services and EndpointSlices in a real API server, then
//
//   - kube-proxy (scripts/testenv/build-tools.sh kube-proxy builds it)
//     runs in a network namespace of its own, reaching the API server
//     through a forwarder; its first full sync's duration is the sum of
//     kubeproxy_sync_full_proxy_rules_duration_seconds (IPv4) after it,
//     and each change's the increase of the partial sync histogram's sum
//     (kubeproxy_sync_partial_proxy_rules_duration_seconds) over the syncs
//     that change caused;
//   - outpost's proxy (netproxy/proxy) runs on a store holding the same
//     objects (as the API server returned them) and programs the kernel
//     in another fresh network namespace: its first Sync, then one Sync
//     after the store writes of each change, as its loop runs them.
//
// The changes are: add a Service (its EndpointSlice exists already, so
// kube-proxy syncs once, with its endpoints), change its endpoints (one
// of five goes), delete it. Each is measured pbReps times for
// kube-proxy and pbReps × pbOutpostRounds times for outpost (the same
// changes again); medians are reported. outpost's time is the proxy's Sync: reading what changed from
// the store, building it, applying it to the kernel; kube-proxy's is its
// syncProxyRules, which its min-sync-period (1 s) delays but does not
// lengthen. The ratio is outpost ÷ kube-proxy. One iteration is the
// whole run: use -benchtime 1x.
func BenchmarkProxyVsKubeProxy(b *testing.B) {
	env.RequireRoot(b)
	kp := filepath.Join(env.ToolsDir(), "bin", "kube-proxy")
	if _, err := os.Stat(kp); err != nil {
		b.Skipf("kube-proxy not built (%v): run scripts/testenv/build-tools.sh kube-proxy as root", err)
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed (kube-proxy's nftables mode runs nft)", tool)
		}
	}
	sizes := pbSizes(b)
	c := newPBCluster(b)
	var rows []pbRow
	for si, n := range sizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.StopTimer()
			c.grow(b, n)
			row := pbRow{n: n, kpOps: map[string]time.Duration{}, opOps: map[string]pbTimes{}}
			kpNetns, extras := c.kubeProxyRun(b, kp, n, pbExtra+si*pbReps, &row)
			// kube-proxy's namespace goes only after outpost's run: the
			// kernel tears a big table down in the background, which
			// would slow outpost's syncs down.
			c.outpostRun(b, n, extras, &row)
			kpNetns.close()
			rows = append(rows, row)
			if row.opErr != nil {
				return
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(row.opCold.total()), "outpost-cold-ms")
			b.ReportMetric(ms(row.kpCold), "kube-proxy-cold-ms")
			b.ReportMetric(row.opCold.total().Seconds()/row.kpCold.Seconds(), "cold-ratio")
			for _, op := range pbOps {
				b.ReportMetric(ms(row.opOps[op].total()), "outpost-"+op+"-ms")
				b.ReportMetric(ms(row.kpOps[op]), "kube-proxy-"+op+"-ms")
				b.ReportMetric(row.opOps[op].total().Seconds()/row.kpOps[op].Seconds(), op+"-ratio")
			}
			for _, f := range pbMemFields {
				b.ReportMetric(float64(row.kpMem[f])/1024, "kube-proxy-"+f+"-MiB")
			}
		})
	}
	// On stdout: a parent benchmark's log is not printed.
	fmt.Printf("service proxy, N Services × %d endpoints (outpost = the proxy's Sync, of which the kernel apply in brackets; kube-proxy = syncProxyRules; one-Service changes: medians of %d for outpost, %d for kube-proxy):\n%s",
		pbEndpoints, pbReps*pbOutpostRounds, pbReps, pbTable(rows))
}

// pbSizes returns the sizes to run, from OUTPOST_BENCH_PROXY_SIZES.
func pbSizes(b *testing.B) []int {
	v := os.Getenv("OUTPOST_BENCH_PROXY_SIZES")
	if v == "" {
		return []int{100, 1000, 10000}
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n >= pbExtra {
			b.Fatalf("OUTPOST_BENCH_PROXY_SIZES=%q: want numbers of Services from 1 to %d, comma-separated", v, pbExtra-1)
		}
		out = append(out, n)
	}
	slices.Sort(out) // the Services of one size are kept for the next
	return slices.Compact(out)
}

// pbTimes is what outpost spent on one sync.
type pbTimes struct{ build, sync time.Duration }

func (t pbTimes) total() time.Duration { return t.build + t.sync }

// pbRow is one size's figures.
type pbRow struct {
	n      int
	opCold pbTimes
	opErr  error // outpost's sync failed: no figures for it
	kpCold time.Duration
	opOps  map[string]pbTimes
	kpOps  map[string]time.Duration
	// kpMem is kube-proxy's /proc status (VmRSS, RssAnon, RssFile, in
	// kB) after its changes, with the N Services programmed.
	kpMem map[string]int64
}

func pbTable(rows []pbRow) string {
	var sb strings.Builder
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
	}
	fmt.Fprintf(&sb, "%8s  %-6s  %22s  %14s  %8s\n", "services", "change", "outpost ms (apply)", "kube-proxy ms", "ratio")
	for _, r := range rows {
		line := func(what string, o pbTimes, k time.Duration) {
			if r.opErr != nil {
				fmt.Fprintf(&sb, "%8d  %-6s  %22s  %14s  %8s\n", r.n, what, "sync failed", ms(k), "-")
				return
			}
			fmt.Fprintf(&sb, "%8d  %-6s  %22s  %14s  %8.3f\n", r.n, what, ms(o.total())+" ("+ms(o.sync)+")", ms(k), o.total().Seconds()/k.Seconds())
		}
		line("cold", r.opCold, r.kpCold)
		for _, op := range pbOps {
			line(op, r.opOps[op], r.kpOps[op])
		}
		if r.opErr != nil {
			fmt.Fprintf(&sb, "%8d  outpost: %v\n", r.n, r.opErr)
		}
	}
	return sb.String()
}

// pbCluster is the API server with the workload, as the API server
// returned each object.
type pbCluster struct {
	api    *env.APIServer
	cl     *kube.Client
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
}

// newPBCluster starts an API server with the benchmark's namespace, a
// ServiceCIDR for the cluster IPs, and the Node of kube-proxy (which
// waits for its Node's addresses).
func newPBCluster(b *testing.B) *pbCluster {
	b.Helper()
	api := env.StartAPIServer(b)
	cfg := rest.CopyConfig(api.Config)
	cfg.QPS = -1 // no client-side rate limit: the creates are the setup, not the benchmark
	cl, err := kube.NewClient(cfg, "outpost-bench-proxy")
	if err != nil {
		b.Fatal(err)
	}
	manifest := filepath.Join(b.TempDir(), "setup.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: Namespace
metadata: {name: `+pbNamespace+`}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: outpost-bench}
spec: {cidrs: [`+pbServiceCIDR+`]}
`), 0o644); err != nil {
		b.Fatal(err)
	}
	api.Kubectl(b, "apply", "-f", manifest)
	ctx := b.Context()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pbNode, Labels: map[string]string{"kubernetes.io/hostname": pbNode}}}
	if err := cl.Core.Post().Resource("nodes").Body(node).Do(ctx).Into(node); err != nil {
		b.Fatalf("create node %s: %v", pbNode, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}
	if err := cl.Core.Put().Resource("nodes").Name(pbNode).SubResource("status").Body(node).Do(ctx).Error(); err != nil {
		b.Fatalf("set node %s addresses: %v", pbNode, err)
	}
	return &pbCluster{api: api, cl: cl}
}

// pbName is the name of Service i and of its EndpointSlice.
func pbName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// pbAddr returns the address n after base.
func pbAddr(base [4]byte, n int) string {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], binary.BigEndian.Uint32(base[:])+uint32(n))
	return netip.AddrFrom4(a).String()
}

func pbPtr[T any](v T) *T { return &v }

// pbService is Service i: a ClusterIP from pbServiceCIDR, port 80/TCP to
// 8080.
func pbService(i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: pbName(i), Namespace: pbNamespace},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: pbAddr([4]byte{10, 96, 0, 0}, 1+i),
			Ports:     []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// pbSlice is Service i's EndpointSlice: five ready endpoints, the first
// two on pbNode.
func pbSlice(i int) *discoveryv1.EndpointSlice {
	eps := make([]discoveryv1.Endpoint, pbEndpoints)
	for j := range eps {
		node := "other-node"
		if j < 2 {
			node = pbNode
		}
		eps[j] = discoveryv1.Endpoint{
			Addresses:  []string{pbAddr([4]byte{10, 64, 0, 0}, 1+i*pbEndpoints+j)},
			Conditions: discoveryv1.EndpointConditions{Ready: pbPtr(true), Serving: pbPtr(true), Terminating: pbPtr(false)},
			NodeName:   pbPtr(node),
		}
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: pbName(i), Namespace: pbNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: pbName(i), discoveryv1.LabelManagedBy: "outpost-bench",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: pbPtr("http"), Protocol: pbPtr(corev1.ProtocolTCP), Port: pbPtr(int32(8080))}},
	}
}

func (c *pbCluster) createService(b *testing.B, i int) *corev1.Service {
	b.Helper()
	out := &corev1.Service{}
	if err := c.cl.Core.Post().Namespace(pbNamespace).Resource("services").Body(pbService(i)).Do(b.Context()).Into(out); err != nil {
		b.Fatalf("create service %s: %v", pbName(i), err)
	}
	return out
}

func (c *pbCluster) createSlice(b *testing.B, i int) *discoveryv1.EndpointSlice {
	b.Helper()
	out := &discoveryv1.EndpointSlice{}
	if err := c.cl.Discovery.Post().Namespace(pbNamespace).Resource("endpointslices").Body(pbSlice(i)).Do(b.Context()).Into(out); err != nil {
		b.Fatalf("create endpointslice %s: %v", pbName(i), err)
	}
	return out
}

// grow creates Services and slices up to n, 16 requests at a time.
func (c *pbCluster) grow(b *testing.B, n int) {
	b.Helper()
	from := len(c.svcs)
	if n <= from {
		return
	}
	start := time.Now()
	if from == 0 {
		// The API server learns of the new ServiceCIDR from a watch: the
		// first Service in it may be refused for a moment. The probe has
		// an index no other Service uses.
		within(30*time.Second).For(b, "a Service in the bench ServiceCIDR", func() (bool, string) {
			err := c.cl.Core.Post().Namespace(pbNamespace).Resource("services").Body(pbService(pbProbe)).Do(b.Context()).Error()
			return err == nil, fmt.Sprint(err)
		})
		if err := c.cl.Core.Delete().Namespace(pbNamespace).Resource("services").Name(pbName(pbProbe)).Do(b.Context()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	c.svcs = append(c.svcs, make([]*corev1.Service, n-from)...)
	c.slices = append(c.slices, make([]*discoveryv1.EndpointSlice, n-from)...)
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range 16 {
		wg.Go(func() {
			ctx := b.Context()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				svc, sl := &corev1.Service{}, &discoveryv1.EndpointSlice{}
				err := errors.Join(
					c.cl.Core.Post().Namespace(pbNamespace).Resource("services").Body(pbService(i)).Do(ctx).Into(svc),
					c.cl.Discovery.Post().Namespace(pbNamespace).Resource("endpointslices").Body(pbSlice(i)).Do(ctx).Into(sl))
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("create %s: %w", pbName(i), err))
					mu.Unlock()
					return
				}
				c.svcs[i], c.slices[i] = svc, sl
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(errors.Join(errs...))
	}
	b.Logf("created Services and EndpointSlices %d to %d in %v", from, n-1, time.Since(start).Round(time.Millisecond))
}

// pbExtraObjects are one added, changed and deleted Service as the API
// server returned them: the Service, its slice, and the slice changed.
type pbExtraObjects struct {
	svc             *corev1.Service
	slice, modified *discoveryv1.EndpointSlice
}

// pbNetns is a named network namespace, deleted by close (or in b's
// cleanup).
type pbNetns struct {
	name string
	fd   int
	once sync.Once
}

func newPBNetns(b *testing.B, prefix string) *pbNetns {
	b.Helper()
	ns := &pbNetns{name: fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1e9), fd: -1}
	if out, err := exec.Command("ip", "netns", "add", ns.name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add %s: %v\n%s", ns.name, err, out)
	}
	b.Cleanup(ns.close)
	if out, err := exec.Command("ip", "-n", ns.name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		b.Fatalf("lo up in %s: %v\n%s", ns.name, err, out)
	}
	fd, err := unix.Open(ns.path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	ns.fd = fd
	return ns
}

func (ns *pbNetns) path() string { return "/run/netns/" + ns.name }

func (ns *pbNetns) close() {
	ns.once.Do(func() {
		if ns.fd >= 0 {
			unix.Close(ns.fd)
		}
		exec.Command("ip", "netns", "delete", ns.name).Run()
	})
}

// outpostRun measures outpost on the first n Services and the extras
// kube-proxy was measured with.
func (c *pbCluster) outpostRun(b *testing.B, n int, extras []pbExtraObjects, row *pbRow) {
	b.Helper()
	ns := newPBNetns(b, "obench-op")
	defer ns.close()
	nl := nft.NewNetlink(ns.fd)
	defer nl.Close()
	rs := &nfttest.Timed{Ruleset: nl}
	st, err := store.Open(filepath.Join(b.TempDir(), store.FileName), store.Options{NodeName: pbNode})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Services().Replace(store.SourceAPI, c.svcs[:n]); err != nil {
		b.Fatal(err)
	}
	if _, err := st.EndpointSlices().Replace(store.SourceAPI, c.slices[:n]); err != nil {
		b.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{Node: pbNode, PodCIDR: netip.MustParsePrefix(pbPodCIDR)}, proxy.Deps{Store: st, Ruleset: rs})
	if err != nil {
		b.Fatal(err)
	}
	// One timed Sync after the store writes of each step, as the proxy
	// loop runs it when the store tells it something changed.
	syncStep := func(what string, wantPorts int) (pbTimes, error) {
		rs.Applying = 0
		t0 := time.Now()
		err := p.Sync()
		total := time.Since(t0)
		if err != nil {
			return pbTimes{}, fmt.Errorf("%s: sync (after %v): %w", what, total.Round(time.Millisecond), err)
		}
		if got := p.Stats().Services; got != wantPorts {
			b.Fatalf("%s: the proxy programs %d service ports, want %d", what, got, wantPorts)
		}
		return pbTimes{build: total - rs.Applying, sync: rs.Applying}, nil
	}
	// A failed sync is reported in the row and the run goes on, so that
	// kube-proxy's figures and the other sizes are still printed.
	fail := func(err error) {
		row.opErr = err
		b.Errorf("outpost: %v", err)
	}
	if row.opCold, err = syncStep("cold sync", n); err != nil {
		fail(err)
		return
	}
	if got := pbServiceChains(b, nl); got != n {
		b.Fatalf("after the cold sync the kernel DNATs %d services, want %d", got, n)
	}
	b.Logf("outpost: cold sync of %d services: %v, of which %v applying", n, row.opCold.total().Round(time.Microsecond), row.opCold.sync.Round(time.Microsecond))
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	// Each round makes the same changes: the Service was deleted at the
	// end of the round before, and its slice is written again.
	times := map[string][]pbTimes{}
	for range pbOutpostRounds {
		for _, x := range extras {
			for _, step := range []struct {
				op    string
				ports int
				write func()
			}{
				{"add", n + 1, func() {
					must(st.EndpointSlices().Put(store.SourceAPI, x.slice))
					must(st.Services().Put(store.SourceAPI, x.svc))
				}},
				{"change", n + 1, func() { must(st.EndpointSlices().Put(store.SourceAPI, x.modified)) }},
				{"delete", n, func() {
					_, err := st.Services().Delete(x.svc.Namespace, x.svc.Name)
					must(err)
				}},
			} {
				step.write()
				t, err := syncStep(step.op, step.ports)
				if err != nil {
					fail(err)
					return
				}
				times[step.op] = append(times[step.op], t)
			}
			// Its slice stays, as kube-proxy's does (the API server has it).
		}
	}
	for _, op := range pbOps {
		ts := times[op]
		slices.SortFunc(ts, func(a, b pbTimes) int { return cmp.Compare(a.total(), b.total()) })
		row.opOps[op] = ts[len(ts)/2]
		b.Logf("outpost: %s one service with %d: sync %v", op, n, pbRoundTimes(ts))
	}
}

func pbRoundTimes(ts []pbTimes) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.total().Round(time.Microsecond)
	}
	return out
}

// pbServiceChains counts the Services the outpost table DNATs: those
// with chains of their own (service-HASH-ns/name/…) and those the shared
// rules DNAT (their cluster IPs in the set cluster-ips).
func pbServiceChains(b *testing.B, nl *nft.Netlink) int {
	b.Helper()
	c, err := nl.List()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, ch := range c.Chains {
		if strings.HasPrefix(ch, "service-") && strings.Contains(ch, "/") {
			n++
		}
	}
	if slices.Contains(c.Maps, "cluster-ips") {
		grouped, err := nl.Elements("cluster-ips")
		if err != nil {
			b.Fatal(err)
		}
		n += grouped
	}
	return n
}

// kubeProxyRun starts kube-proxy on the first n Services, measures its
// cold sync and pbReps × add, change and delete of Services first,
// first+1, …, and stops it. It returns its network namespace, for the
// caller to delete, and the objects of each change.
func (c *pbCluster) kubeProxyRun(b *testing.B, bin string, n, first int, row *pbRow) (*pbNetns, []pbExtraObjects) {
	b.Helper()
	kp := startKubeProxy(b, c.api, bin)
	defer kp.stopProcess()

	// The cold sync: kube-proxy syncs once it has listed Services and
	// EndpointSlices; that first sync is full.
	var cold pbHist
	within(pbColdTimeout).For(b, "kube-proxy's first full sync", func() (bool, string) {
		if kp.exited() {
			b.Fatalf("kube-proxy exited; log:\n%s", kp.tail(40))
		}
		h, err := kp.hist("kubeproxy_sync_full_proxy_rules_duration_seconds")
		if err != nil || h.count == 0 {
			return false, fmt.Sprint(err, h)
		}
		cold = h
		return true, ""
	})
	if cold.count != 1 {
		b.Logf("kube-proxy: %v full syncs by the first look; the first one's time is taken as their mean", cold.count)
	}
	row.kpCold = time.Duration(cold.sum / cold.count * float64(time.Second))
	if got := kp.serviceIPs(b); got != n {
		b.Fatalf("kube-proxy's service-ips map has %d elements after its first full sync, want %d; log:\n%s", got, n, kp.tail(40))
	}
	b.Logf("kube-proxy: cold (full) sync of %d services: %v", n, row.kpCold.Round(time.Microsecond))

	partial := "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	kp.settle(b, partial, false)
	ctx := b.Context()
	times := map[string][]time.Duration{}
	var extras []pbExtraObjects
	for r := range pbReps {
		i := first + r
		// The slice first, so that the Service's add is one sync with its
		// endpoints, as outpost's is.
		x := pbExtraObjects{slice: c.createSlice(b, i)}
		kp.settle(b, partial, false)

		measure := func(op string, change func()) {
			before := kp.mustHist(b, partial)
			change()
			after := kp.settle(b, partial, true)
			if d := after.count - before.count; d != 1 {
				b.Logf("kube-proxy: %s of %s took %v partial syncs", op, pbName(i), d)
			}
			times[op] = append(times[op], time.Duration((after.sum-before.sum)*float64(time.Second)))
		}
		measure("add", func() { x.svc = c.createService(b, i) })
		if !kp.hasServiceIP(b, x.svc.Spec.ClusterIP) {
			b.Fatalf("kube-proxy did not add %s (%s)", pbName(i), x.svc.Spec.ClusterIP)
		}
		measure("change", func() {
			x.modified = x.slice.DeepCopy()
			x.modified.Endpoints = x.modified.Endpoints[1:]
			if err := c.cl.Discovery.Put().Namespace(pbNamespace).Resource("endpointslices").Name(pbName(i)).Body(x.modified).Do(ctx).Into(x.modified); err != nil {
				b.Fatalf("update endpointslice %s: %v", pbName(i), err)
			}
		})
		measure("delete", func() {
			if err := c.cl.Core.Delete().Namespace(pbNamespace).Resource("services").Name(pbName(i)).Do(ctx).Error(); err != nil {
				b.Fatalf("delete service %s: %v", pbName(i), err)
			}
		})
		if kp.hasServiceIP(b, x.svc.Spec.ClusterIP) {
			b.Fatalf("kube-proxy did not delete %s (%s)", pbName(i), x.svc.Spec.ClusterIP)
		}
		if err := c.cl.Discovery.Delete().Namespace(pbNamespace).Resource("endpointslices").Name(pbName(i)).Do(ctx).Error(); err != nil {
			b.Fatalf("delete endpointslice %s: %v", pbName(i), err)
		}
		kp.settle(b, partial, false)
		extras = append(extras, x)
	}
	for _, op := range pbOps {
		ts := times[op]
		slices.Sort(ts)
		row.kpOps[op] = ts[len(ts)/2]
		b.Logf("kube-proxy: %s one service with %d: %v", op, n, benchRound(ts))
	}
	// ip netns exec execs kube-proxy in place: the command's PID is it.
	row.kpMem = benchProcStatus(b, kp.cmd.Process.Pid, pbMemFields...)
	b.Logf("kube-proxy with %d services: VmRSS %d kB, RssAnon %d kB", n, row.kpMem["VmRSS"], row.kpMem["RssAnon"])
	return kp.ns, extras
}

// kubeProxy is an upstream kube-proxy in nftables mode in a network
// namespace of its own.
type kubeProxy struct {
	ns   *pbNetns
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	once sync.Once
}

// startKubeProxy runs kube-proxy against api (admin credentials) in a
// fresh network namespace, where a forwarder makes the API server's
// loopback address reachable. It is stopped, and the namespace deleted,
// by stop or in b's cleanup.
func startKubeProxy(b *testing.B, api *env.APIServer, bin string) *kubeProxy {
	b.Helper()
	ns := newPBNetns(b, "obench-kp")
	u, err := url.Parse(api.URL)
	if err != nil {
		b.Fatal(err)
	}
	benchForward(b, ns.path(), u.Host)
	dir := b.TempDir()
	cfg := filepath.Join(dir, "kube-proxy.yaml")
	// Flags like --proxy-mode are ignored with a config file, so all is
	// here. conntrack maxPerCore 0 and the zero timeouts leave the
	// conntrack sysctls alone; no healthz server.
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
  qps: 100
  burst: 200
hostnameOverride: %s
metricsBindAddress: %s
healthzBindAddress: ""
clusterCIDR: %s
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
nftables:
  minSyncPeriod: 1s
  syncPeriod: 30s
`, api.Kubeconfig, pbNode, pbMetrics, pbClusterCIDR)), 0o644); err != nil {
		b.Fatal(err)
	}
	kp := &kubeProxy{ns: ns, log: filepath.Join(dir, "kube-proxy.log"), done: make(chan struct{})}
	logf, err := os.Create(kp.log)
	if err != nil {
		b.Fatal(err)
	}
	kp.cmd = exec.Command("ip", "netns", "exec", ns.name, bin, "--config", cfg, "--v=2")
	kp.cmd.Stdout, kp.cmd.Stderr = logf, logf
	kp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := kp.cmd.Start(); err != nil {
		logf.Close()
		b.Fatalf("start kube-proxy: %v", err)
	}
	go func() { kp.cmd.Wait(); logf.Close(); close(kp.done) }()
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("kube-proxy log (last lines):\n%s", kp.tail(40))
		}
		kp.stop()
	})
	return kp
}

// stop stops kube-proxy and deletes its namespace.
func (kp *kubeProxy) stop() {
	kp.stopProcess()
	kp.ns.close()
}

// stopProcess stops kube-proxy's process group: SIGTERM, then SIGKILL
// after 10 s.
func (kp *kubeProxy) stopProcess() {
	kp.once.Do(func() {
		syscall.Kill(-kp.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-kp.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-kp.cmd.Process.Pid, syscall.SIGKILL)
			<-kp.done
		}
	})
}

func (kp *kubeProxy) exited() bool {
	select {
	case <-kp.done:
		return true
	default:
		return false
	}
}

func (kp *kubeProxy) tail(n int) string {
	data, _ := os.ReadFile(kp.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pbHist is a histogram's sum (seconds) and count.
type pbHist struct{ sum, count float64 }

// hist reads the IPv4 series of a histogram from kube-proxy's metrics,
// scraped from inside its namespace; a histogram not observed yet is
// zero.
func (kp *kubeProxy) hist(name string) (pbHist, error) {
	conn, err := dialInNetns(kp.ns.path(), pbMetrics)
	if err != nil {
		return pbHist{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", pbMetrics)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return pbHist{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return pbHist{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return pbParseHist(resp.Body, name)
}

// pbParseHist finds name's _sum and _count with ip_family="IPv4" in
// Prometheus text.
func pbParseHist(r io.Reader, name string) (pbHist, error) {
	var h pbHist
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_") || !strings.Contains(line, `ip_family="IPv4"`) {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return h, fmt.Errorf("metric %q: %w", line, err)
		}
		switch {
		case strings.HasPrefix(key, name+"_sum{"):
			h.sum = v
		case strings.HasPrefix(key, name+"_count{"):
			h.count = v
		}
	}
	return h, sc.Err()
}

func (kp *kubeProxy) mustHist(b *testing.B, name string) pbHist {
	b.Helper()
	h, err := kp.hist(name)
	if err != nil {
		b.Fatalf("kube-proxy metrics: %v", err)
	}
	return h
}

// settle waits until kube-proxy's syncs are over: until the count of
// name has not moved for pbSettle (and, when changed is set, moved at
// all first, within 30 s). It returns the histogram then.
func (kp *kubeProxy) settle(b *testing.B, name string, changed bool) pbHist {
	b.Helper()
	first := kp.mustHist(b, name)
	last, since := first, time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		if kp.exited() {
			b.Fatalf("kube-proxy exited; log:\n%s", kp.tail(40))
		}
		h := kp.mustHist(b, name)
		if h.count != last.count {
			last, since = h, time.Now()
			continue
		}
		moved := last.count != first.count
		if time.Since(since) >= pbSettle && (moved || !changed) {
			return last
		}
		if changed && !moved && time.Now().After(deadline) {
			b.Fatalf("kube-proxy did not sync within 30 s of a change; log:\n%s", kp.tail(40))
		}
	}
}

// nft runs nft inside kube-proxy's namespace.
func (kp *kubeProxy) nft(b *testing.B, args ...string) (string, error) {
	b.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", kp.ns.name, "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// serviceIPs counts the elements of kube-proxy's IPv4 service-ips map.
func (kp *kubeProxy) serviceIPs(b *testing.B) int {
	b.Helper()
	out, err := kp.nft(b, "list", "map", "ip", "kube-proxy", "service-ips")
	if err != nil {
		b.Fatalf("nft list map ip kube-proxy service-ips: %v\n%s", err, out)
	}
	return strings.Count(out, " : goto ")
}

// hasServiceIP reports whether kube-proxy's service-ips map has ip's
// port 80/TCP.
func (kp *kubeProxy) hasServiceIP(b *testing.B, ip string) bool {
	b.Helper()
	_, err := kp.nft(b, "get", "element", "ip", "kube-proxy", "service-ips", "{ "+ip+" . tcp . 80 }")
	return err == nil
}

// BenchmarkAgentRSS10kServices runs the real agent (in a network
// namespace of its own, on a private containerd, no pods, with the node
// identity) against an API server holding 10,000 Services × 5 endpoints
// (OUTPOST_BENCH_RSS_SERVICES for another number) and reports, once its
// store holds them all and its nftables table DNATs each, the
// time that took from the agent's start (programmed-s), its VmRSS,
// RssAnon and RssFile at that moment and again after 30 s of steady
// state, and its peak (VmHWM), in MiB. BENCH_OUTPOST=PATH runs that
// binary instead of TestMain's (scripts/bench-proxy.sh passes a static,
// stripped one, as shipped). Use -benchtime 1x.
func BenchmarkAgentRSS10kServices(b *testing.B) {
	env.RequireRoot(b)
	if benchBin() == "" {
		b.Fatal("outpost binary not built (TestMain builds it as root)")
	}
	n := 10000
	if v := os.Getenv("OUTPOST_BENCH_RSS_SERVICES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n >= pbExtra {
			b.Fatalf("OUTPOST_BENCH_RSS_SERVICES=%q: want a number of Services from 1 to %d", v, pbExtra-1)
		}
	}
	b.StopTimer()
	c := newPBCluster(b)
	// What docs/api.md has an operator apply once per cluster: nodes may
	// read EndpointSlices.
	c.api.Kubectl(b, "apply", "-f", "../../packaging/rbac.yaml")
	c.grow(b, n)

	start := time.Now()
	node := startBenchNode(b, "bench-rss", c.api)
	within(10*time.Minute).For(b, fmt.Sprintf("%d services in the agent's store", n), func() (bool, string) {
		s, err := node.status()
		if err != nil {
			return false, err.Error()
		}
		return len(s.Services) >= n, fmt.Sprintf("%d services", len(s.Services))
	})
	stored := time.Since(start)
	pid := node.agentPID(b) // now that nsenter has become the agent
	fd, err := unix.Open("/run/netns/"+node.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	nl := nft.NewNetlink(fd)
	// Until the table holds them all; when it never does, the memory is
	// still read (and the benchmark fails).
	chains, deadline := 0, time.Now().Add(pbRSSTableTimeout)
	for chains = pbServiceChains(b, nl); chains != n && time.Now().Before(deadline); chains = pbServiceChains(b, nl) {
		time.Sleep(time.Second)
	}
	programmed := time.Since(start)
	if chains != n {
		b.Errorf("the agent's table DNATs %d services %v after its start, want %d; agent log (last lines):\n%s",
			chains, programmed.Round(time.Second), n, pbAgentLogTail(node))
	}
	fields := []string{"VmRSS", "RssAnon", "RssFile", "VmHWM"}
	mib := func(kb int64) float64 { return float64(kb) / 1024 }
	at := benchProcStatus(b, pid, fields...)
	time.Sleep(30 * time.Second)
	steady := benchProcStatus(b, pid, fields...)
	if got := pbServiceChains(b, nl); got != chains {
		b.Logf("%d services DNATed after the steady state, %d before", got, chains)
	}
	b.Logf("agent %s (pid %d) with %d services: in the store after %v, in the table after %v; "+
		"then VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f); after 30 s VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f: %s); peak VmHWM %.1f MiB",
		benchBin(), pid, n, stored.Round(time.Millisecond), programmed.Round(time.Millisecond),
		mib(at["VmRSS"]), mib(at["RssAnon"]), mib(at["RssFile"]),
		mib(steady["VmRSS"]), mib(steady["RssAnon"]), mib(steady["RssFile"]), benchFileRss(b, pid), mib(steady["VmHWM"]))
	if chains != n {
		return
	}
	b.ReportMetric(programmed.Seconds(), "programmed-s")
	b.ReportMetric(mib(at["VmRSS"]), "VmRSS-programmed-MiB")
	b.ReportMetric(mib(steady["VmRSS"]), "VmRSS-MiB")
	b.ReportMetric(mib(steady["RssAnon"]), "RssAnon-MiB")
	b.ReportMetric(mib(steady["RssFile"]), "RssFile-MiB")
	b.ReportMetric(mib(steady["VmHWM"]), "VmHWM-MiB")
}

// pbAgentLogTail returns the last lines of the agent's log about the
// service proxy.
func pbAgentLogTail(n *benchNode) string {
	data, _ := os.ReadFile(filepath.Join(n.dir, "agent.log"))
	var lines []string
	for l := range strings.SplitSeq(string(data), "\n") {
		if strings.Contains(l, "proxy") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}
