package tunnel

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the tests if a goroutine the package started is still
// running once they all ended: every one must stop with its streams.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := leftGoroutines(5 * time.Second); left != "" {
			fmt.Fprintf(os.Stderr, "goroutines of package tunnel left after the tests:\n%s\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// leftGoroutines waits up to d for the package's goroutines to end and
// returns the stacks of those left.
func leftGoroutines(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var left []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "sync/mqtt/tunnel.(*mux)") || strings.Contains(g, "sync/mqtt/tunnel.withTimeout") {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
