package nfttest

import (
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/netproxy/nft"
)

// Ruleset is what an nft.Table applies through (proxy.Ruleset): Netlink,
// or the Fake.
type Ruleset interface {
	Apply(tx *nft.Tx) error
	List() (nft.Contents, error)
}

// Timed is a Ruleset that adds up the time its Applies take, for
// benchmarks that report the kernel's share of a sync.
type Timed struct {
	Ruleset
	// Applying is the time spent in Apply since it was last zeroed.
	Applying time.Duration
}

// Apply applies tx through the wrapped Ruleset and adds its time to
// Applying.
func (t *Timed) Apply(tx *nft.Tx) error {
	// A benchmark's time is the wall clock's.
	wall := clock.Real{}
	start := wall.Now()
	err := t.Ruleset.Apply(tx)
	t.Applying += wall.Since(start)
	return err
}
