// Package waittest is the one way tests wait for something another
// goroutine or process does: poll a condition until it holds or a
// deadline passes, then fail saying what was awaited and what was last
// seen.
//
// A condition is called once per look, on the test's goroutine, so it
// may call t.Fatal. What is awaited may fire on a fake clock's timers: a
// Poll's Between moves that clock between looks.
package waittest

import (
	"testing"
	"time"
)

// Every is how often a Poll with no Every of its own looks.
const Every = 10 * time.Millisecond

// A Poll says how long to wait at most and how often to look.
type Poll struct {
	// Timeout is how long to look before failing the test.
	Timeout time.Duration
	// Every is the wall time between looks; 0 means the package's Every.
	// A condition that moves a fake clock or only reads memory may look
	// every millisecond; one that asks a server, less often.
	Every time.Duration
	// Between, if set, runs after each wait and before the next look:
	// a test advances its fake clock there, so that the timers the code
	// under test waits on fire.
	Between func()
}

// For looks at cond until it reports ok. After p.Timeout it fails t
// with what, and with seen from cond's last look.
func (p Poll) For(t testing.TB, what string, cond func() (ok bool, seen string)) {
	t.Helper()
	every := p.Every
	if every <= 0 {
		every = Every
	}
	deadline := time.Now().Add(p.Timeout)
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if seen == "" {
				t.Fatalf("timed out after %v waiting for %s", p.Timeout, what)
			}
			t.Fatalf("timed out after %v waiting for %s; last seen: %s", p.Timeout, what, seen)
		}
		time.Sleep(every)
		if p.Between != nil {
			p.Between()
		}
	}
}

// Until is For for a condition that has nothing to report but whether
// it holds.
func (p Poll) Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	p.For(t, what, func() (bool, string) { return cond(), "" })
}

// For looks at cond every Every until it reports ok, for at most
// timeout; see Poll.For.
func For(t testing.TB, what string, timeout time.Duration, cond func() (ok bool, seen string)) {
	t.Helper()
	Poll{Timeout: timeout}.For(t, what, cond)
}

// Until looks at cond every Every until it holds, for at most timeout;
// see Poll.Until.
func Until(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	Poll{Timeout: timeout}.Until(t, what, cond)
}
