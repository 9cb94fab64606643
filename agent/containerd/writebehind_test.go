package containerd

import (
	"os/exec"
	"testing"
	"time"
)

// TestProcessStart: a process started now has its start time from the
// kernel within the clock tick and boot-time rounding of when it was
// started.
func TestProcessStart(t *testing.T) {
	before := time.Now()
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to start: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	after := time.Now()
	boot, ok := bootTime(time.Now())
	if !ok {
		t.Fatal("no boot time")
	}
	at, ok := processStart(uint32(cmd.Process.Pid), boot)
	if !ok {
		t.Fatal("no start time for a running process")
	}
	// A tick is 10 ms; the boot time is measured to the microsecond.
	if at.Before(before.Add(-20*time.Millisecond)) || at.After(after.Add(20*time.Millisecond)) {
		t.Errorf("process started at %v, between %v and %v by the wall clock", at, before, after)
	}
	if _, ok := processStart(noPID, boot); ok {
		t.Error("a start time for a process that cannot exist")
	}
}
