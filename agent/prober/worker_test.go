package prober

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/waittest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// call is one attempt of the fake exec probe, waiting for the test to say
// how the command exits.
type call struct {
	at    time.Time  // fake time of the attempt
	reply chan reply // buffered
}

type reply struct {
	code int
	err  error
}

type change struct {
	r   Result
	msg string
}

// harness runs one worker whose exec probe the test answers attempt by
// attempt, on a fake clock.
type harness struct {
	t       *testing.T
	clk     *clocktest.Fake
	w       *Worker
	calls   chan call
	changes chan change
	tried   chan Result // OnAttempt's calls
	cancel  context.CancelFunc
	done    chan struct{}
}

// execWorkerProbe is an exec probe with a long timeout, so the per-attempt
// wall-clock deadline never interferes with the fake schedule.
func execWorkerProbe(mod func(p *corev1.Probe)) *corev1.Probe {
	p := execProbe("check")
	p.TimeoutSeconds = 3600
	if mod != nil {
		mod(p)
	}
	return p
}

func newHarness(t *testing.T, cfg WorkerConfig, rnd func(int64) int64) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		clk:     clocktest.New(t0),
		calls:   make(chan call),
		changes: make(chan change, 16),
		tried:   make(chan Result, 64),
		done:    make(chan struct{}),
	}
	cfg.Target.Exec = func(ctx context.Context, cmd []string) (int, []byte, error) {
		c := call{at: h.clk.Now(), reply: make(chan reply, 1)}
		select {
		case h.calls <- c:
		case <-ctx.Done():
			return -1, nil, ctx.Err()
		}
		select {
		case r := <-c.reply:
			return r.code, []byte(fmt.Sprintf("exit %d", r.code)), r.err
		case <-ctx.Done():
			return -1, nil, ctx.Err()
		}
	}
	w, err := NewWorker(cfg, Deps{
		Clock:    h.clk,
		Rand:     rnd,
		OnChange: func(r Result, msg string) { h.changes <- change{r, msg} },
		OnAttempt: func(r Result) {
			select {
			case h.tried <- r:
			default: // a test that does not look may make many attempts
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.w = w
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	return h
}

// stopped reports whether Run has returned.
func (h *harness) stopped() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// settle waits until the worker is parked: its timer armed for the next
// attempt, or Run returned. Everything the last attempt caused (OnChange)
// has happened by then.
func (h *harness) settle() {
	h.t.Helper()
	// Hardly a sleep: the worker needs only to be scheduled. The limit
	// only turns a hang into a failure.
	waittest.Poll{Timeout: 10 * time.Second, Every: time.Microsecond}.For(h.t, "the worker to park", func() (bool, string) {
		n := h.clk.Waiters()
		return n == 1 || h.stopped(), fmt.Sprintf("%d waiters on the fake clock, Run not returned", n)
	})
}

// attempt waits for the worker's next attempt, checks it happens at fake
// time at, answers it and waits for the worker to park.
func (h *harness) attempt(at time.Duration, r reply) {
	h.t.Helper()
	var c call
	select {
	case c = <-h.calls:
	case <-h.done:
		h.t.Fatalf("worker stopped; want an attempt at +%v", at)
	case <-time.After(10 * time.Second):
		h.t.Fatalf("no attempt; want one at +%v", at)
	}
	if got := c.at.Sub(t0); got != at {
		h.t.Fatalf("attempt at +%v, want +%v", got, at)
	}
	c.reply <- r
	h.settle()
}

// noAttempt checks that the parked worker made no attempt.
func (h *harness) noAttempt() {
	h.t.Helper()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected attempt at +%v", c.at.Sub(t0))
	default:
	}
}

// changed returns the OnChange calls made so far.
func (h *harness) changed() []change {
	var got []change
	for {
		select {
		case c := <-h.changes:
			got = append(got, c)
		default:
			return got
		}
	}
}

var (
	ok      = reply{code: 0}
	fail    = reply{code: 1}
	errored = reply{code: -1, err: errors.New("runtime down")}
)

func TestWorkerInitialDelay(t *testing.T) {
	tests := []struct {
		name    string
		started time.Duration // container start relative to Run; 0 means at Run
		first   time.Duration // first attempt, fake time after t0
	}{
		{"new container waits initialDelaySeconds", 0, 5 * time.Second},
		{"container started 3s ago waits the rest", -3 * time.Second, 2 * time.Second},
		{"delay already past probes at once", -time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := WorkerConfig{Kind: Readiness, Probe: execWorkerProbe(func(p *corev1.Probe) { p.InitialDelaySeconds = 5 })}
			if tt.started != 0 {
				cfg.Started = t0.Add(tt.started)
			}
			h := newHarness(t, cfg, nil)
			if tt.first > 0 {
				h.settle()
				h.clk.Advance(tt.first - time.Second)
				h.noAttempt()
				h.clk.Advance(time.Second)
			}
			h.attempt(tt.first, ok)
			h.clk.Advance(10 * time.Second)
			h.attempt(tt.first+10*time.Second, ok)
			h.clk.Advance(9 * time.Second)
			h.noAttempt()
			h.clk.Advance(time.Second)
			h.attempt(tt.first+20*time.Second, ok)
		})
	}
}

func TestWorkerJitter(t *testing.T) {
	tests := []struct {
		name    string
		started time.Duration
		// agentUp is when the agent started, from the worker's start
		// (none: zero); jitter is Jitter; jittered, whether the first
		// probe waits a random part of a period.
		agentUp          time.Duration
		jitter, jittered bool
		first            time.Duration
	}{
		{"after initialDelaySeconds, never before", 0, 0, true, true, 5*time.Second + 4*time.Second},
		{"running container found at agent restart", -time.Hour, 0, true, true, 4 * time.Second},
		{"agent started less than a period ago", 0, -6 * time.Second, false, true, 5*time.Second + 4*time.Second},
		{"agent started a period ago or more: none", 0, -7 * time.Second, false, false, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []int64
			rnd := func(n int64) int64 {
				asked = append(asked, n)
				return int64(4 * time.Second)
			}
			cfg := WorkerConfig{
				Kind:   Liveness,
				Probe:  execWorkerProbe(func(p *corev1.Probe) { p.InitialDelaySeconds = 5; p.PeriodSeconds = 7 }),
				Jitter: tt.jitter,
			}
			if tt.started != 0 {
				cfg.Started = t0.Add(tt.started)
			}
			if tt.agentUp != 0 {
				cfg.AgentStarted = t0.Add(tt.agentUp)
			}
			h := newHarness(t, cfg, rnd)
			h.settle()
			h.clk.Advance(tt.first - time.Second)
			h.noAttempt()
			h.clk.Advance(time.Second)
			h.attempt(tt.first, ok)
			h.clk.Advance(7 * time.Second)
			h.attempt(tt.first+7*time.Second, ok)
			if !tt.jittered {
				if len(asked) != 0 {
					t.Fatalf("Rand called with %v; want no jitter", asked)
				}
				return
			}
			if len(asked) != 1 || asked[0] != int64(7*time.Second) {
				t.Fatalf("Rand called with %v; want once with one period (%d)", asked, int64(7*time.Second))
			}
		})
	}
}

func TestWorkerLivenessFailsAfterFailureThreshold(t *testing.T) {
	h := newHarness(t, WorkerConfig{Kind: Liveness, Probe: execWorkerProbe(nil)}, nil)
	if got := h.w.Result(); got != Success {
		t.Fatalf("initial liveness result %v, want success", got)
	}
	for i, at := range []time.Duration{0, 10 * time.Second} {
		h.attempt(at, fail)
		if c := h.changed(); len(c) != 0 {
			t.Fatalf("after failure %d: OnChange %v; want none before the 3rd", i+1, c)
		}
		if got := h.w.Result(); got != Success {
			t.Fatalf("after failure %d: result %v, want success", i+1, got)
		}
		h.clk.Advance(10 * time.Second)
	}
	h.attempt(20*time.Second, fail)
	if c := h.changed(); len(c) != 1 || c[0] != (change{Failure, "command exited with code 1: exit 1"}) {
		t.Fatalf("after the 3rd failure: OnChange %v; want one failure", c)
	}
	if got := h.w.Result(); got != Failure {
		t.Fatalf("result %v, want failure", got)
	}
	// The container is to be restarted: this worker is done.
	if !h.stopped() {
		t.Fatal("liveness worker still running after failure")
	}
	if n := h.clk.Waiters(); n != 0 {
		t.Fatalf("%d timers left armed", n)
	}
}

// attempted returns the OnAttempt calls made so far.
func (h *harness) attempted() []Result {
	var got []Result
	for {
		select {
		case r := <-h.tried:
			got = append(got, r)
		default:
			return got
		}
	}
}

func TestWorkerReportsEveryAttempt(t *testing.T) {
	pr := execWorkerProbe(func(p *corev1.Probe) { p.FailureThreshold, p.PeriodSeconds = 3, 1 })
	h := newHarness(t, WorkerConfig{Kind: Readiness, Probe: pr}, nil)
	for i, r := range []reply{ok, errored, fail, fail} {
		if i > 0 {
			h.clk.Advance(time.Second)
		}
		h.attempt(time.Duration(i)*time.Second, r)
	}
	if got, want := fmt.Sprint(h.attempted()), "[success unknown failure failure]"; got != want {
		t.Errorf("OnAttempt calls %s, want %s", got, want)
	}
	// An attempt cut short by the end of Run is not reported.
	h.clk.Advance(time.Second)
	select {
	case <-h.calls:
	case <-time.After(10 * time.Second):
		t.Fatal("no attempt")
	}
	h.cancel()
	<-h.done
	if got := h.attempted(); len(got) != 0 {
		t.Errorf("OnAttempt calls after cancel: %v", got)
	}
}

func TestWorkerThresholds(t *testing.T) {
	type step struct {
		reply reply
		want  Result // thresholded result after the attempt
		ch    bool   // whether OnChange is called
	}
	tests := []struct {
		name    string
		kind    Kind
		success int32
		failure int32
		steps   []step
	}{
		{"readiness successThreshold 2", Readiness, 2, 2, []step{
			{ok, Failure, false},
			{fail, Failure, false}, // breaks the run of successes
			{ok, Failure, false},
			{ok, Success, true},
			{ok, Success, false},
			{fail, Success, false},
			{ok, Success, false}, // breaks the run of failures
			{fail, Success, false},
			{fail, Failure, true},
			{fail, Failure, false},
			{ok, Failure, false},
			{ok, Success, true},
		}},
		{"errored attempts neither count nor break a run", Readiness, 2, 2, []step{
			{ok, Failure, false},
			{errored, Failure, false},
			{ok, Success, true},
			{fail, Success, false},
			{errored, Success, false},
			{errored, Success, false},
			{fail, Failure, true},
		}},
		{"steady liveness success reports nothing", Liveness, 0, 0, []step{
			{ok, Success, false}, {ok, Success, false}, {ok, Success, false}, {ok, Success, false}, {ok, Success, false},
		}},
		{"steady readiness failure reports nothing", Readiness, 0, 0, []step{
			{fail, Failure, false}, {fail, Failure, false}, {fail, Failure, false}, {fail, Failure, false}, {fail, Failure, false},
		}},
		{"liveness recovers within failureThreshold", Liveness, 1, 3, []step{
			{fail, Success, false}, {fail, Success, false}, {ok, Success, false},
			{fail, Success, false}, {fail, Success, false}, {ok, Success, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pr := execWorkerProbe(func(p *corev1.Probe) {
				p.SuccessThreshold, p.FailureThreshold, p.PeriodSeconds = tt.success, tt.failure, 3
			})
			h := newHarness(t, WorkerConfig{Kind: tt.kind, Probe: pr}, nil)
			for i, s := range tt.steps {
				if i > 0 {
					h.clk.Advance(3 * time.Second)
				}
				h.attempt(time.Duration(i)*3*time.Second, s.reply)
				c := h.changed()
				if s.ch && (len(c) != 1 || c[0].r != s.want) {
					t.Fatalf("step %d: OnChange %v; want one call with %v", i, c, s.want)
				}
				if !s.ch && len(c) != 0 {
					t.Fatalf("step %d: OnChange %v; want none", i, c)
				}
				if got := h.w.Result(); got != s.want {
					t.Fatalf("step %d: result %v, want %v", i, got, s.want)
				}
			}
		})
	}
}

func TestWorkerStartupStopsAfterSuccess(t *testing.T) {
	h := newHarness(t, WorkerConfig{Kind: Startup, Probe: execWorkerProbe(func(p *corev1.Probe) {
		p.PeriodSeconds, p.FailureThreshold = 2, 30
	})}, nil)
	if got := h.w.Result(); got != Unknown {
		t.Fatalf("initial startup result %v, want unknown", got)
	}
	h.attempt(0, fail)
	h.clk.Advance(2 * time.Second)
	h.attempt(2*time.Second, fail)
	if c := h.changed(); len(c) != 0 {
		t.Fatalf("OnChange %v before success", c)
	}
	h.clk.Advance(2 * time.Second)
	h.attempt(4*time.Second, ok)
	if c := h.changed(); len(c) != 1 || c[0].r != Success {
		t.Fatalf("OnChange %v; want one success", c)
	}
	if !h.stopped() {
		t.Fatal("startup worker still running after success")
	}
	h.clk.Advance(time.Hour)
	h.noAttempt()
	if got := h.w.Result(); got != Success {
		t.Fatalf("result %v, want success", got)
	}
}

func TestWorkerStartupFailureStops(t *testing.T) {
	h := newHarness(t, WorkerConfig{Kind: Startup, Probe: execWorkerProbe(func(p *corev1.Probe) { p.FailureThreshold = 2 })}, nil)
	h.attempt(0, fail)
	h.clk.Advance(10 * time.Second)
	h.attempt(10*time.Second, fail)
	if c := h.changed(); len(c) != 1 || c[0].r != Failure {
		t.Fatalf("OnChange %v; want one failure", c)
	}
	if !h.stopped() {
		t.Fatal("startup worker still running after failure")
	}
}

func TestWorkerSkipsPeriodsAnAttemptOverran(t *testing.T) {
	h := newHarness(t, WorkerConfig{Kind: Readiness, Probe: execWorkerProbe(nil)}, nil)
	c := <-h.calls
	h.clk.Advance(25 * time.Second) // the command takes 25s of a 10s period
	c.reply <- ok
	h.settle()
	h.clk.Advance(4 * time.Second)
	h.noAttempt()
	h.clk.Advance(time.Second)
	h.attempt(30*time.Second, ok)
}

func TestWorkerRunReturnsWhenCancelled(t *testing.T) {
	t.Run("while waiting", func(t *testing.T) {
		h := newHarness(t, WorkerConfig{Kind: Readiness, Probe: execWorkerProbe(nil)}, nil)
		h.attempt(0, ok)
		h.cancel()
		<-h.done
		if n := h.clk.Waiters(); n != 0 {
			t.Fatalf("%d timers left armed", n)
		}
	})
	t.Run("during an attempt", func(t *testing.T) {
		h := newHarness(t, WorkerConfig{Kind: Liveness, Probe: execWorkerProbe(func(p *corev1.Probe) { p.FailureThreshold = 1 })}, nil)
		<-h.calls // the attempt hangs until its context ends
		h.cancel()
		<-h.done
		if c := h.changed(); len(c) != 0 {
			t.Fatalf("OnChange %v for a cancelled attempt", c)
		}
		if got := h.w.Result(); got != Success {
			t.Fatalf("result %v after a cancelled attempt, want success", got)
		}
	})
	t.Run("before the first attempt", func(t *testing.T) {
		h := newHarness(t, WorkerConfig{Kind: Readiness, Probe: execWorkerProbe(func(p *corev1.Probe) { p.InitialDelaySeconds = 30 })}, nil)
		h.settle()
		h.cancel()
		<-h.done
		h.clk.Advance(time.Hour)
		h.noAttempt()
	})
}

func TestNewWorkerRejectsBadProbes(t *testing.T) {
	fakeExec := func(context.Context, []string) (int, []byte, error) { return 0, nil, nil }
	target := Target{Host: "10.1.0.5", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}, Exec: fakeExec}
	http := func(port intstr.IntOrString) *corev1.Probe { return httpGet("/healthz", port) }
	with := func(p *corev1.Probe, mod func(*corev1.Probe)) *corev1.Probe { mod(p); return p }
	one := int64(1)
	tests := []struct {
		name   string
		kind   Kind
		probe  *corev1.Probe
		target Target
		want   string // the whole error; "" means valid
	}{
		{"valid httpGet named port", Readiness, http(intstr.FromString("http")), target, ""},
		{"valid readiness successThreshold 3", Readiness, with(execProbe("true"), func(p *corev1.Probe) { p.SuccessThreshold = 3 }), target, ""},
		{"unknown named port", Readiness, http(intstr.FromString("web")), target, `readinessProbe.httpGet.port: no container port named "web"`},
		{"port 0", Liveness, tcpSocket(intstr.FromInt(0)), target, "livenessProbe.tcpSocket.port: 0 is not a valid port number (1-65535)"},
		{"nil probe", Liveness, nil, target, "livenessProbe: is required"},
		{"no handler", Readiness, &corev1.Probe{}, target, "readinessProbe: must specify a handler (exec, httpGet, tcpSocket or grpc)"},
		{"two handlers", Startup, with(execProbe("true"), func(p *corev1.Probe) { p.GRPC = &corev1.GRPCAction{Port: 9000} }), target,
			"startupProbe: may not specify more than one handler"},
		{"empty command", Liveness, execProbe(), target, "livenessProbe.exec.command: is required"},
		{"exec without a runtime", Liveness, execProbe("true"), Target{Host: "10.1.0.5"}, "livenessProbe.exec: the target cannot run commands"},
		{"bad scheme", Readiness, with(http(intstr.FromInt(80)), func(p *corev1.Probe) { p.HTTPGet.Scheme = "FTP" }), target,
			`readinessProbe.httpGet.scheme: "FTP" is not HTTP or HTTPS`},
		{"bad header name", Readiness, with(http(intstr.FromInt(80)), func(p *corev1.Probe) {
			p.HTTPGet.HTTPHeaders = []corev1.HTTPHeader{{Name: "Bad Name", Value: "x"}}
		}), target, `readinessProbe.httpGet.httpHeaders[0].name: "Bad Name" is not a valid header name`},
		{"no host", Readiness, tcpSocket(intstr.FromInt(80)), Target{}, "readinessProbe.tcpSocket.host: is empty and the target has no pod IP"},
		{"grpc port", Liveness, grpcProbe(70000, nil), target, "livenessProbe.grpc.port: 70000 is not a valid port number (1-65535)"},
		{"liveness successThreshold", Liveness, with(execProbe("true"), func(p *corev1.Probe) { p.SuccessThreshold = 2 }), target,
			"livenessProbe.successThreshold: 2 must be 1 for liveness probes"},
		{"startup successThreshold", Startup, with(execProbe("true"), func(p *corev1.Probe) { p.SuccessThreshold = 3 }), target,
			"startupProbe.successThreshold: 3 must be 1 for startup probes"},
		{"negative failureThreshold", Startup, with(execProbe("true"), func(p *corev1.Probe) { p.FailureThreshold = -1 }), target,
			"startupProbe.failureThreshold: -1 must not be negative"},
		{"readiness terminationGracePeriodSeconds", Readiness, with(execProbe("true"), func(p *corev1.Probe) { p.TerminationGracePeriodSeconds = &one }), target,
			"readinessProbe.terminationGracePeriodSeconds: must not be set for readiness probes"},
		{"every error is reported", Readiness, with(http(intstr.FromString("web")), func(p *corev1.Probe) { p.PeriodSeconds = -10 }), target,
			"readinessProbe.periodSeconds: -10 must not be negative\n" + `readinessProbe.httpGet.port: no container port named "web"`},
		{"unknown kind", Kind(7), execProbe("true"), target, "kind: Kind(7) is not liveness, readiness or startup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewWorker(WorkerConfig{Kind: tt.kind, Probe: tt.probe, Target: tt.target}, Deps{Clock: clocktest.New(t0)})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("NewWorker: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("NewWorker error:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
	t.Run("no clock", func(t *testing.T) {
		_, err := NewWorker(WorkerConfig{Kind: Liveness, Probe: execProbe("true"), Target: target}, Deps{})
		if err == nil || err.Error() != "deps.Clock: is required" {
			t.Fatalf("NewWorker without a clock: %v", err)
		}
	})
}

func TestNewWorkerCopiesTheProbe(t *testing.T) {
	p := execProbe("true")
	w, err := NewWorker(WorkerConfig{Kind: Liveness, Probe: p, Target: Target{Exec: func(context.Context, []string) (int, []byte, error) { return 0, nil, nil }}},
		Deps{Clock: clocktest.New(t0)})
	if err != nil {
		t.Fatal(err)
	}
	p.Exec.Command[0] = "false"
	if w.probe.Exec.Command[0] != "true" {
		t.Fatal("worker shares the caller's probe")
	}
}

func TestStrings(t *testing.T) {
	got := strings.Join([]string{
		Liveness.String(), Readiness.String(), Startup.String(), Kind(9).String(),
		Unknown.String(), Success.String(), Failure.String(), Result(9).String(),
	}, " ")
	if want := "liveness readiness startup Kind(9) unknown success failure Result(9)"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
