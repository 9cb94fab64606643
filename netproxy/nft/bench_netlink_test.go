package nft_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/netnstest"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
)

// benchNetlinkSizes are the numbers of Services (5 endpoints each) the
// kernel benchmarks run with.
var benchNetlinkSizes = []int{100, 1000, 10000}

// BenchmarkNetlinkColdSync: the first Sync of N Services (genState: 5
// endpoints each, every fourth with a NodePort) on the real kernel, each
// op in a fresh network namespace (made outside the timer). ms/op is the
// whole Sync, kernel-ms/op its Apply (building and sending the netlink
// batch and the kernel's answer), txops/op the Tx's size.
func BenchmarkNetlinkColdSync(b *testing.B) {
	for _, n := range benchNetlinkSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			benchRequireNetlink(b)
			s := genState(n)
			var ops int
			var apply time.Duration
			b.StopTimer()
			b.ResetTimer()
			for range b.N {
				// The namespaces stay open until the end, so the kernel does
				// not tear down the last table while the next one is timed.
				rs := &nfttest.Timed{Ruleset: nft.NewNetlink(benchNetNS(b))}
				tb := nft.NewTable(rs)
				b.StartTimer()
				got, err := tb.Sync(s)
				b.StopTimer()
				if err != nil {
					b.Fatalf("cold sync of %d services: %v", n, err)
				}
				ops += got
				apply += rs.Applying
			}
			benchReport(b, ops, apply)
		})
	}
}

// BenchmarkNetlinkUpdateOne: with N Services applied on the real kernel
// (a fresh network namespace per size, shared by its three
// sub-benchmarks), one op is one Sync that adds a Service (5 endpoints),
// changes its endpoints (one of five goes) or deletes it. The Sync that
// sets up each op (deleting the Service again, or adding it) is outside
// the timer. ms/op is the whole Sync, kernel-ms/op its Apply, txops/op
// the Tx's size.
func BenchmarkNetlinkUpdateOne(b *testing.B) {
	for _, n := range benchNetlinkSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			benchRequireNetlink(b)
			base := genState(n)
			extra := genService(n + 1)
			changed := extra
			changed.Endpoints = slices.Clone(extra.Endpoints[1:])
			added, modified := withServices(base, extra), withServices(base, changed)
			rs := &nfttest.Timed{Ruleset: nft.NewNetlink(benchNetNS(b))}
			tb := nft.NewTable(rs)
			if _, err := tb.Sync(base); err != nil {
				b.Fatalf("sync %d services: %v", n, err)
			}
			for _, step := range []struct {
				name          string
				before, after nft.State
			}{
				{"add", base, added},
				{"change", added, modified},
				{"delete", added, base},
			} {
				b.Run(step.name, func(b *testing.B) {
					b.StopTimer()
					b.ResetTimer()
					var ops int
					var apply time.Duration
					for range b.N {
						if _, err := tb.Sync(step.before); err != nil {
							b.Fatalf("set up %s: %v", step.name, err)
						}
						rs.Applying = 0
						b.StartTimer()
						got, err := tb.Sync(step.after)
						b.StopTimer()
						if err != nil {
							b.Fatalf("%s one service with %d applied: %v", step.name, n, err)
						}
						ops += got
						apply += rs.Applying
					}
					benchReport(b, ops, apply)
				})
			}
		})
	}
}

func benchReport(b *testing.B, ops int, apply time.Duration) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
	b.ReportMetric(ms(b.Elapsed()), "ms/op")
	b.ReportMetric(ms(apply), "kernel-ms/op")
	b.ReportMetric(float64(ops)/float64(b.N), "txops/op")
}

// benchRequireNetlink skips b when not root or when this kernel has no
// nftables netlink.
func benchRequireNetlink(b *testing.B) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates network namespaces and nftables tables (run as root, e.g. sudo make bench)")
	}
	if err := nft.Available(); err != nil {
		b.Skipf("no nftables netlink in this kernel: %v", err)
	}
}

// benchNetNS creates an anonymous network namespace, closed in b's
// cleanup, and returns a file descriptor for it; the benchmark process's
// own namespace is never programmed. It skips b when namespaces cannot be
// made.
func benchNetNS(b *testing.B) int {
	b.Helper()
	fd, err := netnstest.Create()
	if err != nil {
		b.Skipf("cannot create a network namespace: %v", err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	return fd
}
