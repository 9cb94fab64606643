package kube

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/report"
)

// certSlot is a certificate the node requests from the cluster and
// renews: the certificate in use, its renewal deadline, where it stands,
// and the loop that keeps it current. Bootstrapper (the client
// certificate) and ServingCerts (the serving certificate) embed it.
type certSlot struct {
	what   string // "client" or "serving", for the log
	clock  clock.Clock
	log    *slog.Logger
	jitter func() float64
	// logAttrs are logged with a request and a certificate put in use.
	logAttrs []any

	mu      sync.Mutex
	cert    *tls.Certificate // nil until one is usable
	renewAt time.Time
	state   report.Cert
}

// State returns where the certificate stands.
func (c *certSlot) State() report.Cert {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state
	s.Usable = c.cert != nil && c.clock.Now().Before(c.cert.Leaf.NotAfter)
	return s
}

// install makes cert the one in use, sets its renewal deadline and
// records the state valid, with csr the request it came from, under one
// lock: whoever sees the certificate sees its state, and its log line.
// swapped, when not nil, runs under that lock too, so whoever sees the
// new state also sees what it did (the client closing the connections
// made with the old certificate).
func (c *certSlot) install(cert *tls.Certificate, csr string, swapped func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cert = cert
	c.renewAt = renewalDeadline(cert.Leaf, c.jitter())
	if swapped != nil {
		swapped()
	}
	c.setStateLocked(report.CertValid, "", csr)
}

// run calls request when there is no certificate, and again when the
// renewal deadline passed, until ctx ends. Failures are retried with the
// reconnect backoff and recorded in the state.
func (c *certSlot) run(ctx context.Context, request func(context.Context) error) {
	bo := newReconnectBackoff()
	for ctx.Err() == nil {
		c.mu.Lock()
		have, renewAt := c.cert != nil, c.renewAt
		c.mu.Unlock()
		if now := c.clock.Now(); have && now.Before(renewAt) {
			sleepClock(ctx, c.clock, min(renewAt.Sub(now), certRecheckEvery))
			continue
		}
		err := request(ctx)
		if err == nil {
			bo.Reset()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		var d *csrDeniedError
		if errors.As(err, &d) {
			c.setState(report.CertDenied, err.Error()+"; delete it to have the node request again", d.name)
		} else {
			c.setState(report.CertFailing, err.Error(), "")
		}
		sleepClock(ctx, c.clock, bo.Next())
	}
}

// setState records phase and reason and logs a change of either.
func (c *certSlot) setState(phase report.CertPhase, reason, csr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setStateLocked(phase, reason, csr)
}

// setStateLocked is setState with c.mu held. It logs under the lock, so
// that the log line is written by the time anyone sees the state.
func (c *certSlot) setStateLocked(phase report.CertPhase, reason, csr string) {
	changed := c.state.Phase != phase || c.state.Reason != reason
	if changed {
		c.state.Since = c.clock.Now()
	}
	c.state.Phase, c.state.Reason, c.state.CSR = phase, reason, csr
	if c.cert != nil {
		c.state.Subject = c.cert.Leaf.Subject.String()
		c.state.NotAfter, c.state.RenewAt = c.cert.Leaf.NotAfter, c.renewAt
	}
	if !changed {
		return
	}
	s := c.state
	switch s.Phase {
	case report.CertValid:
		c.log.Info(c.what+" certificate in use", append([]any{"subject", s.Subject, "notAfter", s.NotAfter, "renewAt", s.RenewAt}, c.logAttrs...)...)
	case report.CertRequesting:
		c.log.Info("requesting "+c.what+" certificate", append([]any{"csr", s.CSR, "reason", s.Reason}, c.logAttrs...)...)
	case report.CertDenied:
		c.log.Warn(c.what+" certificate request denied; checking it again later", "csr", s.CSR, "reason", s.Reason)
	case report.CertFailing:
		c.log.Warn(c.what+" certificate request failed; retrying", "err", s.Reason)
	}
}
