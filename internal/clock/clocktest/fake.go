// Package clocktest provides a fake clock.Clock whose time moves only when a
// test calls Advance.
package clocktest

import (
	"sort"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Fake is a clock.Clock that stands still until Advance is called. Timers
// and tickers fire during Advance, in time order.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter
}

type waiter struct {
	at     time.Time
	period time.Duration // 0 for a timer
	ch     chan time.Time
	active bool
}

var _ clock.Clock = (*Fake)(nil)

// New returns a fake clock set to start.
func New(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since returns the fake time elapsed since t.
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) clock.Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &waiter{at: f.now.Add(d), ch: make(chan time.Time, 1), active: true}
	f.waiters = append(f.waiters, w)
	return &fakeTimer{f: f, w: w}
}

// NewTicker returns a ticker that fires every d of fake time.
func (f *Fake) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("clocktest: non-positive ticker period")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &waiter{at: f.now.Add(d), period: d, ch: make(chan time.Time, 1), active: true}
	f.waiters = append(f.waiters, w)
	return &fakeTicker{f: f, w: w}
}

// Waiters returns how many timers and tickers are active, so a test can wait
// until a component has armed its timer before advancing.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.waiters {
		if w.active {
			n++
		}
	}
	return n
}

// Armed reports whether a timer or ticker is active and due d from now,
// so a test can wait for a particular timer before advancing past it.
func (f *Fake) Armed(d time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.now.Add(d)
	for _, w := range f.waiters {
		if w.active && w.at.Equal(at) {
			return true
		}
	}
	return false
}

// Advance moves the fake time forward by d, firing every timer and ticker
// that falls due on the way. Like a real ticker, a tick whose channel is
// full is dropped.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := f.now.Add(d)
	for {
		active := f.waiters[:0]
		for _, w := range f.waiters {
			if w.active {
				active = append(active, w)
			}
		}
		f.waiters = active
		sort.SliceStable(f.waiters, func(i, j int) bool { return f.waiters[i].at.Before(f.waiters[j].at) })
		if len(f.waiters) == 0 || f.waiters[0].at.After(end) {
			break
		}
		w := f.waiters[0]
		f.now = w.at
		select {
		case w.ch <- w.at:
		default:
		}
		if w.period > 0 {
			w.at = w.at.Add(w.period)
		} else {
			w.active = false
		}
	}
	f.now = end
}

type fakeTimer struct {
	f *Fake
	w *waiter
}

func (t *fakeTimer) C() <-chan time.Time { return t.w.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.w.active
	t.w.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.w.active
	t.w.at = t.f.now.Add(d)
	if !was {
		t.w.active = true
		t.f.waiters = append(t.f.waiters, t.w)
	}
	return was
}

type fakeTicker struct {
	f *Fake
	w *waiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.w.active = false
}
