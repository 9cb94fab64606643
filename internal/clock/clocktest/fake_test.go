package clocktest

import (
	"testing"
	"time"
)

func TestFakeTimerFiresOnlyWhenDue(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := New(start)
	tm := f.NewTimer(10 * time.Second)
	f.Advance(9 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("timer fired early")
	default:
	}
	f.Advance(time.Second)
	select {
	case got := <-tm.C():
		if want := start.Add(10 * time.Second); !got.Equal(want) {
			t.Fatalf("fired at %v, want %v", got, want)
		}
	default:
		t.Fatal("timer did not fire when due")
	}
	if f.Waiters() != 0 {
		t.Fatalf("fired timer still active")
	}
}

func TestFakeTimerStopAndReset(t *testing.T) {
	f := New(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of an active timer reported inactive")
	}
	f.Advance(2 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported active")
	}
	f.Advance(time.Second)
	select {
	case <-tm.C():
	default:
		t.Fatal("reset timer did not fire")
	}
}

func TestFakeTickerDropsTicksLikeReal(t *testing.T) {
	f := New(time.Unix(0, 0))
	tk := f.NewTicker(time.Second)
	defer tk.Stop()
	f.Advance(5 * time.Second)
	n := 0
	for {
		select {
		case <-tk.C():
			n++
			continue
		default:
		}
		break
	}
	if n != 1 {
		t.Fatalf("got %d buffered ticks, want 1 (the rest dropped)", n)
	}
	if got, want := f.Now(), time.Unix(5, 0); !got.Equal(want) {
		t.Fatalf("now = %v, want %v", got, want)
	}
}

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
