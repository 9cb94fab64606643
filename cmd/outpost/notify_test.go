package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAgentTellsSystemd runs the agent as a Type=notify unit with a
// watchdog would: it says READY=1 once it serves, pets the watchdog, and
// says STOPPING=1 when stopped.
func TestAgentTellsSystemd(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000") // pet every 200 ms
	t.Setenv("WATCHDOG_PID", "")
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("nodeName: test-node\nstateDir: "+filepath.Join(dir, "state")+"\nmanifestDir: "+filepath.Join(dir, "m")+"\nlog: {level: error}\n"), 0o644)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"agent", "--record-only", "--config", cfgPath}, os.Stdout, os.Stderr)
	}()

	next := func() string {
		t.Helper()
		buf := make([]byte, 128)
		l.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(buf[:n])
	}
	if got := next(); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	for i := 0; i < 2; i++ {
		if got := next(); got != "WATCHDOG=1" {
			t.Fatalf("notification %q, want WATCHDOG=1", got)
		}
	}
	cancel()
	for {
		got := next()
		if got == "STOPPING=1" {
			break
		}
		if got != "WATCHDOG=1" {
			t.Fatalf("notification %q while stopping, want STOPPING=1", got)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
}
