package containerd

import (
	"os/exec"
	"testing"
	"time"
)

// TestProcessStart: a process started now has its start time from the
// kernel within the clock tick of when it was started, and of how long
// reading the boot time took.
func TestProcessStart(t *testing.T) {
	before := time.Now()
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to start: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	after := time.Now()
	// bootTime pairs the wall clock with CLOCK_BOOTTIME read a moment
	// later; that moment (long under emulation, or when the test is
	// preempted) makes the boot time, and so the start, seem earlier.
	now := time.Now()
	boot, ok := bootTime(now)
	read := time.Since(now)
	if !ok {
		t.Fatal("no boot time")
	}
	at, ok := processStart(uint32(cmd.Process.Pid), boot)
	if !ok {
		t.Fatal("no start time for a running process")
	}
	// A tick is 10 ms, and the kernel rounds the start down to one.
	const tick, slack = 10 * time.Millisecond, 2 * time.Millisecond
	if at.Before(before.Add(-tick-read-slack)) || at.After(after.Add(slack)) {
		t.Errorf("process started at %v, between %v and %v by the wall clock (boot time read in %v)", at, before, after, read)
	}
	if _, ok := processStart(noPID, boot); ok {
		t.Error("a start time for a process that cannot exist")
	}
}
