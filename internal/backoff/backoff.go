// Package backoff is the retry delay of outpost's links: exponential with
// jitter, so a fleet that lost its link at the same moment does not come
// back in step.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff doubles each delay from Min up to Max and takes a random half
// of it off. Its zero value with Min and Max set is ready to use; it is
// for one goroutine.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the delay before the next try.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

// Fresh reports whether no delay was taken since the start or the last
// Reset: the first failure after a success.
func (b *Backoff) Fresh() bool { return b.cur == 0 }

// Reset starts again from Min, after a success.
func (b *Backoff) Reset() { b.cur = 0 }
