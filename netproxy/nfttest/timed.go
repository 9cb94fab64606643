package nfttest

import (
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/netproxy/nft"
)

// Timed is an nft.Ruleset that adds up the time its Applies take, for
// benchmarks that report the kernel's share of a sync.
type Timed struct {
	nft.Ruleset
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
