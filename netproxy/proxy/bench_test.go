package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/internal/netnstest"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/store"
)

// BenchmarkSyncUnchanged is what one sync costs with N API Services × 5
// endpoints in the store and nothing changed: what every pod status change
// costs the proxy.
func BenchmarkSyncUnchanged(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, p := benchProxy(b, n)
			defer st.Close()
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSyncOneService is what the sync after one store write costs
// with N API Services × 5 endpoints (on the Fake ruleset: the kernel's
// part is in nft's BenchmarkNetlinkUpdateOne): one Service and its slice
// added, the slice changed, the Service and its slice deleted; the store
// writes are not timed.
func BenchmarkSyncOneService(b *testing.B) {
	benchSyncOneService(b, func(*testing.B) Ruleset { return nfttest.NewFake() })
}

// BenchmarkSyncOneServiceKernel is BenchmarkSyncOneService on the real
// kernel, each size in a network namespace of its own: what the
// nftables rows of make bench-peers measure, without the API server.
// kernel-ms/op is the part of the sync spent in the ruleset's Apply.
func BenchmarkSyncOneServiceKernel(b *testing.B) {
	benchSyncOneService(b, func(b *testing.B) Ruleset {
		if err := nft.Available(); err != nil {
			b.Skipf("no nftables netlink in this kernel: %v", err)
		}
		nl := nft.NewNetlink(netnstest.New(b))
		b.Cleanup(func() { nl.Close() })
		return &nfttest.Timed{Ruleset: nl}
	})
}

func benchSyncOneService(b *testing.B, ruleset func(*testing.B) Ruleset) {
	for _, n := range []int{100, 1000, 10000} {
		rs := ruleset(b)
		st, p := benchProxyOn(b, n, rs)
		timed, _ := rs.(*nfttest.Timed)
		svc, sl := benchService(n)
		changed := sl.DeepCopy()
		changed.Endpoints = changed.Endpoints[1:]
		steps := []struct {
			op    string
			write func() error
		}{
			{"add", func() error {
				if err := st.Services().Put(store.SourceAPI, svc); err != nil {
					return err
				}
				return st.EndpointSlices().Put(store.SourceAPI, sl)
			}},
			{"change", func() error { return st.EndpointSlices().Put(store.SourceAPI, changed) }},
			{"delete", func() error {
				if _, err := st.Services().Delete(svc.Namespace, svc.Name); err != nil {
					return err
				}
				_, err := st.EndpointSlices().Delete(sl.Namespace, sl.Name)
				return err
			}},
		}
		for _, step := range steps {
			b.Run(fmt.Sprintf("%s/%d", step.op, n), func(b *testing.B) {
				b.ReportAllocs()
				var apply time.Duration
				for b.Loop() {
					b.StopTimer()
					for _, s := range steps {
						if s.op == step.op {
							break
						}
						if err := s.write(); err != nil {
							b.Fatal(err)
						}
						if err := p.Sync(); err != nil {
							b.Fatal(err)
						}
					}
					if err := step.write(); err != nil {
						b.Fatal(err)
					}
					if timed != nil {
						timed.Applying = 0
					}
					b.StartTimer()
					if err := p.Sync(); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if timed != nil {
						apply += timed.Applying
					}
					for _, s := range steps[slices.IndexFunc(steps, func(s struct {
						op    string
						write func() error
					}) bool {
						return s.op == step.op
					})+1:] {
						if err := s.write(); err != nil {
							b.Fatal(err)
						}
						if err := p.Sync(); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
				}
				if timed != nil {
					b.ReportMetric(float64(apply)/float64(time.Millisecond)/float64(b.N), "kernel-ms/op")
				}
			})
		}
		st.Close()
	}
}

// BenchmarkSyncHeap is the heap the proxy keeps after its first sync of
// N API Services × 5 endpoints (the Index and the Table; the ruleset
// keeps nothing), as live-MiB: most of the agent's memory at 10,000
// Services. BENCH_HEAP_PROFILE=FILE writes the heap profile (every
// allocation sampled) of the last size.
func BenchmarkSyncHeap(b *testing.B) {
	prof := os.Getenv("BENCH_HEAP_PROFILE")
	if prof != "" {
		defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
		runtime.MemProfileRate = 1
	}
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st := benchStore(b, n)
			defer st.Close()
			var live float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				p, err := New(Config{Node: node, PodCIDR: podCIDR}, Deps{Store: st, Ruleset: discardRuleset{}})
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Sync(); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				live = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
				if prof != "" {
					writeHeapProfile(b, prof)
				}
				runtime.KeepAlive(p)
			}
			b.ReportMetric(live, "live-MiB")
		})
	}
}

// discardRuleset applies nothing and holds nothing.
type discardRuleset struct{}

func (discardRuleset) Apply(*nft.Tx) error         { return nil }
func (discardRuleset) List() (nft.Contents, error) { return nft.Contents{}, nil }

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// benchService is API Service i of the benchmarks (svc-<i>, one TCP port)
// and its slice of 5 ready endpoints.
func benchService(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "u"},
		Spec: corev1.ServiceSpec{ClusterIP: netip.AddrFrom4([4]byte{10, 43, byte(i >> 8), byte(i)}).String(),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-x", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for e := range 5 {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{10, 44, byte(i >> 6), byte(i<<2 | e)}).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		})
	}
	return svc, sl
}

// benchProxy is a store with N API Services × 5 endpoints and a proxy
// on the Fake ruleset that synced them once.
func benchProxy(b *testing.B, n int) (*store.Store, *Proxy) {
	return benchProxyOn(b, n, nfttest.NewFake())
}

// benchProxyOn is benchProxy on the ruleset rs.
func benchProxyOn(b *testing.B, n int, rs Ruleset) (*store.Store, *Proxy) {
	st := benchStore(b, n)
	p, err := New(Config{Node: node, PodCIDR: podCIDR}, Deps{Store: st, Ruleset: rs})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Sync(); err != nil {
		b.Fatal(err)
	}
	return st, p
}

// benchStore is a store with N API Services × 5 endpoints.
func benchStore(b *testing.B, n int) *store.Store {
	st, err := store.Open(filepath.Join(b.TempDir(), store.FileName), store.Options{NodeName: node})
	if err != nil {
		b.Fatal(err)
	}
	svcs := make([]*corev1.Service, n)
	sls := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		svcs[i], sls[i] = benchService(i)
	}
	if _, err := st.Services().Replace(store.SourceAPI, svcs); err != nil {
		b.Fatal(err)
	}
	if _, err := st.EndpointSlices().Replace(store.SourceAPI, sls); err != nil {
		b.Fatal(err)
	}
	return st
}
