package podnet

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/store"
)

func TestNetnsName(t *testing.T) {
	for _, tc := range []struct{ prefix, uid, want string }{
		{"outpost-", "6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8", "outpost-6f1c2a3b4d5e"},
		{"outpost-", "abc", "outpost-abc"},
		{"x-", "a-b-c-d-e-f-g-h-i-j-k-l-m-n", "x-abcdefghijkl"},
	} {
		if got := netnsName(tc.prefix, tc.uid); got != tc.want {
			t.Errorf("netnsName(%q, %q) = %q, want %q", tc.prefix, tc.uid, got, tc.want)
		}
	}
}

func TestHostVethName(t *testing.T) {
	a := hostVethName("6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8")
	if a != hostVethName("6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8") {
		t.Fatal("host veth name is not stable")
	}
	// UIDs sharing their first 12 characters still get distinct veths.
	b := hostVethName("6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f9")
	if a == b {
		t.Fatalf("two UIDs share veth name %q", a)
	}
	for _, name := range []string{a, b, hostVethName("static/pod?")} {
		if len(name) != 13 || len(name) > 15 || !strings.HasPrefix(name, "vo") {
			t.Errorf("veth name %q: want vo + 11 hex characters", name)
		}
		if strings.Trim(name[2:], "0123456789abcdef") != "" {
			t.Errorf("veth name %q: not hex after vo", name)
		}
	}
}

func TestCheckUID(t *testing.T) {
	for _, uid := range []string{"", "a/b", "..", "---", "a\x00b"} {
		if err := checkUID(uid); err == nil {
			t.Errorf("checkUID(%q) = nil, want error", uid)
		}
	}
	if err := checkUID("6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8"); err != nil {
		t.Errorf("checkUID(uuid) = %v", err)
	}
}

func TestBridgeMACIsLocalUnicast(t *testing.T) {
	mac := bridgeMAC("outpost0")
	if mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
		t.Errorf("bridge MAC %s: want locally administered unicast", mac)
	}
	if mac.String() != bridgeMAC("outpost0").String() {
		t.Error("bridge MAC is not stable")
	}
}

func TestAddressRange(t *testing.T) {
	r, err := newAddressRange(netip.MustParsePrefix("10.42.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if r.gateway.String() != "10.42.0.1" || r.first.String() != "10.42.0.2" || r.last.String() != "10.42.0.254" {
		t.Errorf("range = gw %s, %s..%s; want gw 10.42.0.1, 10.42.0.2..10.42.0.254", r.gateway, r.first, r.last)
	}
	for _, bad := range []string{"", "fd00::/64", "10.42.0.5/24", "10.42.0.0/31", "10.42.0.0/32"} {
		var p netip.Prefix
		if bad != "" {
			p = netip.MustParsePrefix(bad)
		}
		if _, err := newAddressRange(p); err == nil {
			t.Errorf("newAddressRange(%q) = nil error", bad)
		}
	}
}

func TestChoose(t *testing.T) {
	r24, _ := newAddressRange(netip.MustParsePrefix("10.42.0.0/24"))
	r30, _ := newAddressRange(netip.MustParsePrefix("10.42.0.0/30"))
	for _, tc := range []struct {
		name      string
		rng       addressRange
		allocs    map[string]string
		want      string
		existing  bool
		stale     []string
		errSubstr string
	}{
		{name: "empty gives first after gateway", rng: r24, want: "10.42.0.2"},
		{name: "lowest free", rng: r24, allocs: map[string]string{"10.42.0.2": "x", "10.42.0.4": "y"}, want: "10.42.0.3"},
		{name: "reuse own", rng: r24, allocs: map[string]string{"10.42.0.2": "x", "10.42.0.9": "me"}, want: "10.42.0.9", existing: true},
		{name: "reuse lowest of several own", rng: r24, allocs: map[string]string{"10.42.0.7": "me", "10.42.0.5": "me"}, want: "10.42.0.5", existing: true},
		{name: "own outside range is stale", rng: r24, allocs: map[string]string{"10.43.0.2": "me", "10.42.0.2": "x"}, want: "10.42.0.3", stale: []string{"10.43.0.2"}},
		{name: "own gateway is stale", rng: r24, allocs: map[string]string{"10.42.0.1": "me"}, want: "10.42.0.2", stale: []string{"10.42.0.1"}},
		{name: "foreign garbage key ignored", rng: r24, allocs: map[string]string{"nonsense": "x"}, want: "10.42.0.2"},
		{name: "slash 30 has one address", rng: r30, want: "10.42.0.2"},
		{name: "exhausted", rng: r30, allocs: map[string]string{"10.42.0.2": "x"}, errSubstr: "pod CIDR 10.42.0.0/30 is exhausted"},
		{name: "never broadcast", rng: r30, allocs: map[string]string{"10.42.0.2": "x", "10.42.0.3": "me"}, errSubstr: "exhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.rng.choose(tc.allocs, "me")
			if tc.errSubstr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSubstr) {
					t.Fatalf("choose = %v, %v; want error containing %q", c, err, tc.errSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.addr.String() != tc.want || c.existing != tc.existing || strings.Join(c.stale, ",") != strings.Join(tc.stale, ",") {
				t.Errorf("choose = %s existing=%v stale=%v; want %s existing=%v stale=%v", c.addr, c.existing, c.stale, tc.want, tc.existing, tc.stale)
			}
		})
	}
}

func TestNewDefaultsAndErrors(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), store.FileName), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	n, err := New(Config{PodCIDR: netip.MustParsePrefix("10.42.0.0/24")}, Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if n.cfg.BridgeName != "outpost0" || n.cfg.NetnsDir != "/run/netns" || n.cfg.NetnsPrefix != "outpost-" || n.cfg.MTU != 1500 {
		t.Errorf("defaults = %+v", n.cfg)
	}
	if got := n.NetNSPath("6f1c2a3b-4d5e-6f70-8192-a3b4c5d6e7f8"); got != "/run/netns/outpost-6f1c2a3b4d5e" {
		t.Errorf("NetNSPath = %q", got)
	}
	if !n.hostIsCurrentMust(t) {
		t.Error("zero HostNetNS is not the current netns")
	}
	for name, tc := range map[string]struct {
		cfg  Config
		deps Deps
	}{
		"no store":         {Config{PodCIDR: netip.MustParsePrefix("10.42.0.0/24")}, Deps{}},
		"no cidr":          {Config{}, Deps{Store: st}},
		"long bridge name": {Config{PodCIDR: netip.MustParsePrefix("10.42.0.0/24"), BridgeName: "a-very-long-bridge-name"}, Deps{Store: st}},
		"bad mtu":          {Config{PodCIDR: netip.MustParsePrefix("10.42.0.0/24"), MTU: 20}, Deps{Store: st}},
		"slash in prefix":  {Config{PodCIDR: netip.MustParsePrefix("10.42.0.0/24"), NetnsPrefix: "a/b"}, Deps{Store: st}},
	} {
		if _, err := New(tc.cfg, tc.deps); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func (n *Network) hostIsCurrentMust(t *testing.T) bool {
	t.Helper()
	ok, err := n.hostIsCurrent()
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestKeyedMutexForgetsKeys(t *testing.T) {
	var k keyedMutex
	unlockA := k.lock("a")
	unlockB := k.lock("b") // another key does not wait for a
	unlockB()
	unlockA()
	if len(k.locks) != 0 {
		t.Errorf("locks left behind: %v", k.locks)
	}
}
