package nft_test

import (
	"testing"

	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
)

// TestTableFull: Full tells whether the next Sync is a full one.
func TestTableFull(t *testing.T) {
	r := &failing{Fake: nfttest.NewFake()}
	tb := nft.NewTable(r)
	check := func(when string, want bool) {
		t.Helper()
		if got := tb.Full(); got != want {
			t.Errorf("%s: Full() = %v, want %v", when, got, want)
		}
	}
	check("a new table", true)
	base := tsState()
	if _, err := tb.Sync(base); err != nil {
		t.Fatal(err)
	}
	check("after a sync", false)
	r.failApply = true
	if _, err := tb.Sync(withServices(base, genService(1))); err == nil {
		t.Fatal("Sync did not fail")
	}
	check("after a failed apply", true)
	r.failApply = false
	if _, err := tb.Sync(base); err != nil {
		t.Fatal(err)
	}
	check("after the full sync", false)
	tb.Resync()
	check("after Resync", true)
}
