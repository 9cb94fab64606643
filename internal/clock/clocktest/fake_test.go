package clocktest

import (
	"testing"
	"time"
)

func TestArmed(t *testing.T) {
	f := New(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if !f.Armed(time.Second) || f.Armed(2*time.Second) {
		t.Fatal("a timer due in 1s: Armed(1s) must hold, Armed(2s) not")
	}
	f.Advance(500 * time.Millisecond)
	if !f.Armed(500 * time.Millisecond) {
		t.Fatal("after 500ms, the timer is due 500ms from now")
	}
	f.Advance(500 * time.Millisecond)
	if f.Armed(0) {
		t.Fatal("a fired timer is no longer armed")
	}
	tm.Reset(time.Second)
	if !f.Armed(time.Second) {
		t.Fatal("a timer reset is armed again")
	}
	tm.Stop()
	if f.Armed(time.Second) {
		t.Fatal("a stopped timer is not armed")
	}
}
