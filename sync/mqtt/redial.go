package mqtt

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/outpost-edge/outpost/internal/backoff"
	"github.com/outpost-edge/outpost/internal/clock"
)

// FastRedialFor is how long into an outage a broker whose host refuses
// the connection is tried again every second or so.
const FastRedialFor = 5 * time.Minute

// Redial says how long a link waits before its next connect. A broker
// whose host refuses the TCP connection (the broker's process is down:
// a restart, an upgrade) is tried again after 0.5–1.5 s for the first
// FastRedialFor of an outage: such an outage is usually short, a refused
// connect costs about a hundred bytes (a SYN and a RST), and the link is
// back within about a second of the broker. Every other failure (a
// timeout, a TLS or MQTT refusal, a lost connection) backs off
// exponentially up to Backoff.Max, as does a refusal later in an outage.
// It is for one goroutine.
type Redial struct {
	Backoff backoff.Backoff
	Clock   clock.Clock
	since   time.Time // when the outage began; zero after Reset
}

// Next returns the delay before the next connect after err.
func (r *Redial) Next(err error) time.Duration {
	now := r.Clock.Now()
	if r.since.IsZero() {
		r.since = now
	}
	if Refused(err) && now.Sub(r.since) < FastRedialFor {
		return 500*time.Millisecond + rand.N(time.Second)
	}
	return r.Backoff.Next()
}

// Reset starts again after a connection that was good.
func (r *Redial) Reset() {
	r.Backoff.Reset()
	r.since = time.Time{}
}

// Refused reports whether err says the broker's host refused the TCP
// connection.
func Refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
