package mqtt

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

func TestRedialRetriesARefusedBrokerFastEarlyInAnOutage(t *testing.T) {
	clk := clocktest.New(time.Unix(1_000_000, 0))
	r := Redial{Backoff: backoff.Backoff{Min: 10 * time.Second, Max: 2 * time.Minute}, Clock: clk}
	// As paho returns a refused dial: wrapped twice over the syscall's.
	refused := fmt.Errorf("connect to [ssl://b:8883]: %w", fmt.Errorf("network Error : %w",
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}))
	timeout := errors.New("no answer from the broker in time")

	// A lost connection backs off as before.
	if d := r.Next(errors.New("connection lost")); d < 5*time.Second || d > 10*time.Second {
		t.Errorf("after a lost connection: %v, want the backoff's first step (5–10 s)", d)
	}
	for elapsed := time.Duration(0); elapsed < FastRedialFor; {
		d := r.Next(refused)
		if d < 500*time.Millisecond || d > 1500*time.Millisecond {
			t.Fatalf("refused %v into the outage: wait %v, want 0.5–1.5 s", elapsed, d)
		}
		clk.Advance(d)
		elapsed += d
	}
	// The backoff took no step for the fast tries: it goes on from 20 s.
	if d := r.Next(refused); d < 10*time.Second || d > 20*time.Second {
		t.Errorf("refused past FastRedialFor: wait %v, want the backoff's second step (10–20 s)", d)
	}
	if d := r.Next(timeout); d < 20*time.Second || d > 40*time.Second {
		t.Errorf("a timeout after it: %v, want the backoff's third step (20–40 s)", d)
	}

	r.Reset()
	for range 8 {
		r.Next(timeout)
	}
	if d := r.Next(refused); d > 1500*time.Millisecond {
		t.Errorf("refused after timeouts early in a new outage: %v, want 0.5–1.5 s", d)
	}
	if d := r.Next(timeout); d < time.Minute {
		t.Errorf("a timeout: %v, want the grown backoff (1–2 min)", d)
	}
}

func TestRefusedSeesThroughPahosWrapping(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w : %w", errors.New("network Error"), &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), true},
		{fmt.Errorf("x: %w", errTimeout), false},
		{fmt.Errorf("x: %w", syscall.ECONNRESET), false},
		{nil, false},
	} {
		if got := Refused(tc.err); got != tc.want {
			t.Errorf("Refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
