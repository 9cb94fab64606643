package kube

import (
	"time"

	"github.com/outpost-edge/outpost/internal/waittest"
)

// The waits of this package's tests.
var (
	// spinWait waits for code that runs on a fake clock and a loopback
	// server, so it gets there without time passing. Generous: under
	// qemu-user on a loaded machine a step takes seconds.
	spinWait = waittest.Poll{Timeout: 60 * time.Second, Every: time.Millisecond}
	// reactWait waits in wall time for a goroutine under test to react,
	// never for fake time.
	reactWait = waittest.Poll{Timeout: 10 * time.Second, Every: 5 * time.Millisecond}
	// apiWait waits for a real API server, and for what the code under
	// test does with it at a real clock.
	apiWait = waittest.Poll{Timeout: 30 * time.Second, Every: 50 * time.Millisecond}
)
