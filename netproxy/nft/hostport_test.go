package nft

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func TestNormalize(t *testing.T) {
	podA, podB := ip("10.42.0.2"), ip("10.42.0.3")
	got, err := normalize([]HostPort{
		{Protocol: "udp", HostPort: 53, PodIP: podB, ContainerPort: 5353},
		{HostPort: 80, PodIP: podA, ContainerPort: 8080},                                                        // protocol defaults to TCP
		{Protocol: "TCP", HostPort: 80, PodIP: podB, ContainerPort: 80},                                         // duplicate of the one above: dropped
		{Protocol: "TCP", HostIP: netip.MustParseAddr("0.0.0.0"), HostPort: 81, PodIP: podA, ContainerPort: 81}, // 0.0.0.0 is any
		{Protocol: "TCP", HostIP: netip.MustParseAddr("::ffff:192.0.2.2"), HostPort: 82, PodIP: podA, ContainerPort: 82},
	})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, hp := range got {
		lines = append(lines, hp.String())
	}
	want := []string{
		"tcp :80->10.42.0.2:8080",
		"tcp :81->10.42.0.2:81",
		"tcp 192.0.2.2:82->10.42.0.2:82",
		"udp :53->10.42.0.3:5353",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("normalize =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	for _, tc := range []struct {
		name string
		hp   HostPort
		want string
	}{
		{"bad protocol", HostPort{Protocol: "ICMP", HostPort: 1, PodIP: podA, ContainerPort: 1}, `protocol "ICMP"`},
		{"no host port", HostPort{PodIP: podA, ContainerPort: 1}, "port must be set"},
		{"no container port", HostPort{HostPort: 1, PodIP: podA}, "port must be set"},
		{"no pod ip", HostPort{HostPort: 1, ContainerPort: 1}, "pod IP is not set"},
		{"mixed families", HostPort{HostIP: netip.MustParseAddr("fd00::1"), HostPort: 1, PodIP: podA, ContainerPort: 1}, "different families"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := normalize([]HostPort{tc.hp}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("normalize(%v) = %v, want error containing %q", tc.hp, err, tc.want)
			}
		})
	}
}

// newNetNS creates an anonymous network namespace for the test and
// returns a file descriptor for it; the test process's netns is never
// programmed.
func newNetNS(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and nftables tables")
	}
	requireNFNetlink(t)
	fd, err := createNetNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// createNetNS creates an anonymous network namespace from a thread of its
// own, which goes back to the original namespace, and returns a file
// descriptor for the new one.
func createNetNS() (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr == nil {
			runtime.UnlockOSThread() // else the thread dies with the goroutine
		}
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

// requireNFNetlink skips the test when no NETLINK_NETFILTER socket can be
// made, so nftables cannot be programmed: qemu-user (make test-arm) passes
// only route, uevent and audit netlink through to the kernel. (With a
// NetNS, the socket library then hands nftables a nil connection, which
// panics, so the tests ask first.)
func requireNFNetlink(t *testing.T) {
	t.Helper()
	err := Available()
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skip("no NETLINK_NETFILTER socket (EPROTONOSUPPORT), so no nftables: qemu-user does not emulate it")
	}
	if err != nil {
		t.Fatal(err)
	}
}

func conn(t *testing.T, nsfd int) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(nsfd))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ruleCounts returns the number of rules in each chain of the table.
func ruleCounts(t *testing.T, nsfd int) map[string]int {
	t.Helper()
	c := conn(t, nsfd)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != "outpost" {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		counts[ch.Name] = len(rules)
	}
	return counts
}

func nftVersion() string {
	out, _ := exec.Command("nft", "--version").Output()
	return strings.TrimSpace(string(out))
}

// TestE2ETableHostPortsReplace (was TestE2ESyncReplacesAndDelete of the
// old NAT): in a fresh netns holding an outpost table that someone else
// changed (a stray chain with a rule, a nat-prerouting of another
// priority), the first Sync of a Table replaces its contents, 3,000
// hostPorts (over 6,000 rules) apply in one batch, and after a restart
// (a new Table: a full sync) fewer hostPorts leave fewer rules and the
// stray chain is gone; an incremental Sync without hostPorts empties the
// hostports chain. The kernel then holds what a full sync gives on the
// Fake.
func TestE2ETableHostPortsReplace(t *testing.T) {
	ns := nlNetNS(t)
	c := conn(t, ns)
	c.AddTable(table())
	stray := c.AddChain(&nftables.Chain{Name: "stray", Table: table()})
	c.AddChain(&nftables.Chain{Name: natPrerouting, Table: table(), Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-50)})
	c.AddRule(&nftables.Rule{Table: table(), Chain: stray, Exprs: matchPort("TCP", 1)})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	var many []HostPort
	for i := range 3000 {
		many = append(many, HostPort{Protocol: "TCP", HostPort: uint16(10000 + i), PodIP: tsHPPod, ContainerPort: 8080})
	}
	if _, err := NewTable(NewNetlink(ns)).Sync(State{PodCIDR: tsPodCIDR, HostPorts: many}); err != nil {
		t.Fatalf("sync %d hostPorts: %v", len(many), err)
	}
	// nat-postrouting: the two Service hairpin lookups, jump
	// masquerading, a hairpin rule per hostPort, pod egress masquerade.
	got := ruleCounts(t, ns)
	if got[chainHostPorts] != 3000 || got[natPostrouting] != 3004 || got["stray"] != 0 {
		t.Errorf("rule counts after large sync: hostports %d, nat-postrouting %d, stray %d; want 3000, 3004, 0",
			got[chainHostPorts], got[natPostrouting], got["stray"])
	}

	one := State{PodCIDR: tsPodCIDR, HostPorts: []HostPort{{Protocol: "TCP", HostPort: 30080, PodIP: tsHPPod, ContainerPort: 8080}}}
	tb := NewTable(NewNetlink(ns))
	if _, err := tb.Sync(one); err != nil {
		t.Fatal(err)
	}
	got = ruleCounts(t, ns)
	if _, ok := got["stray"]; ok {
		t.Error("the stray chain survived a full sync")
	}
	if got[chainHostPorts] != 1 || got[natPostrouting] != 5 {
		t.Errorf("rule counts after a full sync with one hostPort: hostports %d, nat-postrouting %d; want 1, 5", got[chainHostPorts], got[natPostrouting])
	}

	none := State{PodCIDR: tsPodCIDR}
	if _, err := tb.Sync(none); err != nil {
		t.Fatal(err)
	}
	fresh, _ := synced(t, none)
	if got, want := normalizeNFT(nftListTable(t, ns)), fresh.Dump(); got != want {
		t.Errorf("kernel differs from a full sync on the Fake (nft %s):\n%s", nftVersion(), lineDiff(want, got))
	}
	if got := ruleCounts(t, ns); got[chainHostPorts] != 0 || got[natPostrouting] != 4 {
		t.Errorf("rule counts without hostPorts: hostports %d, nat-postrouting %d; want 0, 4", got[chainHostPorts], got[natPostrouting])
	}
}
