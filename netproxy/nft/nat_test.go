package nft

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

var (
	podCIDR = netip.MustParsePrefix("10.42.0.0/24")
	podA    = netip.MustParseAddr("10.42.0.2")
	podB    = netip.MustParseAddr("10.42.0.3")
)

func TestNormalize(t *testing.T) {
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

func TestNewNATErrors(t *testing.T) {
	for _, cfg := range []NATConfig{{}, {PodCIDR: netip.MustParsePrefix("10.42.0.7/24")}, {PodCIDR: podCIDR, NetNS: -1}} {
		if _, err := NewNAT(cfg); err == nil {
			t.Errorf("NewNAT(%+v) succeeded", cfg)
		}
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
	if r.err != nil {
		t.Fatalf("create netns: %v", r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
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

// listTable returns `nft list table inet outpost` run inside the netns,
// or skips when nft or nsenter is not installed.
func listTable(t *testing.T, nsfd int) string {
	t.Helper()
	for _, tool := range []string{"nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dup, err := unix.Dup(nsfd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "netns")
	defer f.Close()
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", "nft", "list", "table", "inet", "outpost")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return string(out)
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

// TestE2ESyncGolden: in a fresh netns, Sync builds exactly the ruleset in
// testdata/nat.golden (as nft itself prints it, so the kernel and nft agree
// on what the expressions mean); a second Sync leaves the same ruleset.
func TestE2ESyncGolden(t *testing.T) {
	ns := newNetNS(t)
	n, err := NewNAT(NATConfig{PodCIDR: podCIDR, NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	ports := []HostPort{
		{Protocol: "TCP", HostPort: 30080, PodIP: podA, ContainerPort: 8080},
		{Protocol: "UDP", HostIP: netip.MustParseAddr("192.0.2.2"), HostPort: 5353, PodIP: podB, ContainerPort: 53},
		{Protocol: "SCTP", HostPort: 3868, PodIP: podB, ContainerPort: 3868},
	}
	if err := n.Sync(ports); err != nil {
		t.Fatal(err)
	}
	first := listTable(t, ns)
	if err := n.Sync(ports); err != nil {
		t.Fatal(err)
	}
	got := listTable(t, ns)
	if got != first {
		t.Errorf("second Sync changed the table:\n%s\nfirst:\n%s", got, first)
	}
	golden := filepath.Join("testdata", "nat.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("table differs from %s (nft %s):\n%s", golden, nftVersion(), got)
	}
}

func nftVersion() string {
	out, _ := exec.Command("nft", "--version").Output()
	return strings.TrimSpace(string(out))
}

// TestE2ESyncReplacesAndDelete: Sync replaces the table's contents (fewer
// hostPorts leave fewer rules, and a foreign chain someone added to the
// table is gone), a batch of 9,001 rules applies in one go (with the
// library's default socket buffers sendmsg fails with EMSGSIZE), and Delete
// removes the table and is idempotent.
func TestE2ESyncReplacesAndDelete(t *testing.T) {
	ns := newNetNS(t)
	n, err := NewNAT(NATConfig{PodCIDR: podCIDR, NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	var many []HostPort
	for i := range 3000 {
		many = append(many, HostPort{Protocol: "TCP", HostPort: uint16(10000 + i), PodIP: podA, ContainerPort: 8080})
	}
	if err := n.Sync(many); err != nil {
		t.Fatalf("sync %d hostPorts: %v", len(many), err)
	}
	if got := ruleCounts(t, ns); got[ChainNATPrerouting] != 3000 || got[ChainNATOutput] != 3000 || got[ChainNATPostrouting] != 3001 {
		t.Errorf("rule counts after large sync = %v", got)
	}

	c := conn(t, ns)
	c.AddChain(&nftables.Chain{Name: "stray", Table: table()})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := n.Sync([]HostPort{{Protocol: "TCP", HostPort: 30080, PodIP: podA, ContainerPort: 8080}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{ChainNATPostrouting: 2, ChainNATPrerouting: 1, ChainNATOutput: 1}
	if got := ruleCounts(t, ns); len(got) != len(want) || got[ChainNATPostrouting] != 2 || got[ChainNATPrerouting] != 1 || got[ChainNATOutput] != 1 {
		t.Errorf("rule counts = %v, want %v", got, want)
	}

	for range 2 {
		if err := n.Delete(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn(t, ns).ListTableOfFamily("outpost", nftables.TableFamilyINet); err == nil {
		t.Error("table outpost still exists after Delete")
	}
}
