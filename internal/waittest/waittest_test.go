package waittest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// recTB records a failure and ends its goroutine, as testing.T's Fatalf
// does.
type recTB struct {
	testing.TB
	failed string
}

func (r *recTB) Helper() {}

func (r *recTB) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run waits as wait does with a recTB and returns its failure, if any.
func run(wait func(testing.TB)) string {
	r := &recTB{}
	done := make(chan struct{})
	go func() { defer close(done); wait(r) }()
	<-done
	return r.failed
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	looks := 0
	msg := run(func(tb testing.TB) {
		Poll{Timeout: 10 * time.Second, Every: time.Millisecond}.For(tb, "three looks", func() (bool, string) {
			looks++
			return looks == 3, fmt.Sprint(looks)
		})
	})
	if msg != "" || looks != 3 {
		t.Errorf("failure %q after %d looks, want none after 3", msg, looks)
	}
}

func TestForSaysWhatWasAwaitedAndLastSeen(t *testing.T) {
	looks := 0
	msg := run(func(tb testing.TB) {
		For(tb, "the pod running", 20*time.Millisecond, func() (bool, string) {
			looks++
			return false, fmt.Sprintf("phase Pending (look %d)", looks)
		})
	})
	want := fmt.Sprintf("timed out after 20ms waiting for the pod running; last seen: phase Pending (look %d)", looks)
	if msg != want {
		t.Errorf("failure %q, want %q", msg, want)
	}
	if looks < 2 {
		t.Errorf("%d looks before the deadline, want at least 2", looks)
	}
}

func TestUntilSaysWhatWasAwaited(t *testing.T) {
	msg := run(func(tb testing.TB) { Until(tb, "the link down", time.Millisecond, func() bool { return false }) })
	if want := "timed out after 1ms waiting for the link down"; msg != want {
		t.Errorf("failure %q, want %q", msg, want)
	}
	if strings.Contains(msg, "last seen") {
		t.Errorf("failure %q tells a last sight the condition never reported", msg)
	}
}

func TestBetweenRunsBetweenLooks(t *testing.T) {
	var log []string
	looks := 0
	msg := run(func(tb testing.TB) {
		p := Poll{Timeout: 10 * time.Second, Every: time.Millisecond, Between: func() { log = append(log, "between") }}
		p.Until(tb, "three looks", func() bool {
			looks++
			log = append(log, "look")
			return looks == 3
		})
	})
	if got, want := strings.Join(log, " "), "look between look between look"; msg != "" || got != want {
		t.Errorf("failure %q, calls %q; want none, %q", msg, got, want)
	}
}
