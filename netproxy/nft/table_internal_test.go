package nft

import (
	"net/netip"
	"testing"
)

// TestGroupPacks: a packed group gives back its endpoints, of either
// family.
func TestGroupPacks(t *testing.T) {
	for _, eps := range [][]netip.AddrPort{
		nil,
		{netip.MustParseAddrPort("10.0.0.1:80")},
		{netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("255.1.2.3:65535"), netip.MustParseAddrPort("0.0.0.0:0")},
		{netip.MustParseAddrPort("[fd00::1]:8080"), netip.MustParseAddrPort("[2001:db8::ff:1]:1")},
	} {
		g := packGroup(eps)
		if g.len() != len(eps) {
			t.Fatalf("%v: len %d", eps, g.len())
		}
		for n, want := range eps {
			if got := g.at(n); got != want {
				t.Errorf("%v: at(%d) = %v, want %v", eps, n, got, want)
			}
		}
	}
}
