package prober

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
	corev1 "k8s.io/api/core/v1"
)

// WorkerConfig is one probe of one container instance.
type WorkerConfig struct {
	Kind   Kind
	Probe  *corev1.Probe
	Target Target
	// Started is when the container started; initialDelaySeconds counts
	// from it. Zero means when Run starts.
	Started time.Time
	// Jitter delays the first probe by a random part of one period. Set it
	// for workers the agent starts when it (re)starts, so the probes of
	// containers that were already running do not all fire at once.
	Jitter bool
	// AgentStarted is when the probing agent started. A worker that runs
	// within one period of it jitters too, as kubelet's probe workers do
	// within one period of kubelet's start: after a reboot the first
	// probes of all the node's pods do not come at once, while their
	// containers are still starting.
	AgentStarted time.Time
}

// Deps are a worker's collaborators.
type Deps struct {
	// Clock drives the probe schedule. Required.
	Clock clock.Clock
	// Rand returns a random number in [0, n) for jitter; nil means
	// math/rand/v2's Int64N.
	Rand func(n int64) int64
	// OnChange is called from Run's goroutine when the thresholded result
	// changes, with the message of the attempt that changed it. It must
	// not block for long: the next probe waits for it.
	OnChange func(Result, string)
	// OnAttempt, when set, is called from Run's goroutine with the result
	// of every attempt, before thresholds (for metrics); attempts cut
	// short by the end of Run's context are not reported.
	OnAttempt func(Result)
	// OnWarning, when set, is called from Run's goroutine with the
	// message of every attempt that succeeded with a warning (an httpGet
	// redirect to another host, not followed), as kubelet posts a
	// ProbeWarning event for each.
	OnWarning func(string)
}

// Worker runs one probe of one container instance periodically, with
// kubelet's semantics:
//   - readiness starts as Failure (not ready), liveness as Success and
//     startup as Unknown;
//   - the result changes only after successThreshold successes or
//     failureThreshold failures in a row; attempts that errored (Unknown)
//     neither count nor break a run;
//   - a startup worker stops once its result is decided (Success, or
//     Failure and the container is to be restarted), and a liveness worker
//     stops at Failure (likewise).
type Worker struct {
	kind      Kind
	probe     *corev1.Probe
	target    Target
	started   time.Time
	jitter    bool
	agentUp   time.Time
	clock     clock.Clock
	rand      func(n int64) int64
	onChange  func(Result, string)
	attempt   func(Result)
	onWarning func(string)

	initialDelay     time.Duration
	period           time.Duration
	successThreshold int
	failureThreshold int

	mu     sync.Mutex
	result Result

	// Used only by Run's goroutine: the latest attempt's result and how
	// many attempts in a row had it.
	last Result
	run  int
}

// NewWorker checks cfg and returns a worker; it starts nothing. Errors name
// the field, e.g. `readinessProbe.httpGet.port: no container port named
// "web"`.
func NewWorker(cfg WorkerConfig, deps Deps) (*Worker, error) {
	if cfg.Kind != Liveness && cfg.Kind != Readiness && cfg.Kind != Startup {
		return nil, bad("kind", "%v is not liveness, readiness or startup", cfg.Kind)
	}
	if deps.Clock == nil {
		return nil, bad("deps.Clock", "is required")
	}
	root := cfg.Kind.field()
	if err := validate(root, cfg.Kind, cfg.Probe, cfg.Target); err != nil {
		return nil, err
	}
	p := cfg.Probe
	w := &Worker{
		kind:             cfg.Kind,
		probe:            p.DeepCopy(),
		target:           cfg.Target,
		started:          cfg.Started,
		jitter:           cfg.Jitter,
		agentUp:          cfg.AgentStarted,
		clock:            deps.Clock,
		rand:             deps.Rand,
		onChange:         deps.OnChange,
		attempt:          deps.OnAttempt,
		onWarning:        deps.OnWarning,
		initialDelay:     time.Duration(p.InitialDelaySeconds) * time.Second,
		period:           secondsOr(p.PeriodSeconds, defaultPeriod),
		successThreshold: intOr(p.SuccessThreshold, defaultSuccessThreshold),
		failureThreshold: intOr(p.FailureThreshold, defaultFailureThreshold),
		result:           initialResult(cfg.Kind),
	}
	if w.rand == nil {
		w.rand = rand.Int64N
	}
	if w.onChange == nil {
		w.onChange = func(Result, string) {}
	}
	return w, nil
}

// validate checks the probe's numbers and handler; the errors name fields
// below root.
func validate(root string, k Kind, p *corev1.Probe, t Target) error {
	if p == nil {
		return bad(root, "is required")
	}
	var errs []error
	for _, f := range []struct {
		name string
		v    int32
	}{
		{"initialDelaySeconds", p.InitialDelaySeconds},
		{"timeoutSeconds", p.TimeoutSeconds},
		{"periodSeconds", p.PeriodSeconds},
		{"successThreshold", p.SuccessThreshold},
		{"failureThreshold", p.FailureThreshold},
	} {
		if f.v < 0 {
			errs = append(errs, bad(root+"."+f.name, "%d must not be negative", f.v))
		}
	}
	if k != Readiness && p.SuccessThreshold > 1 {
		errs = append(errs, bad(root+".successThreshold", "%d must be 1 for %s probes", p.SuccessThreshold, k))
	}
	if k == Readiness && p.TerminationGracePeriodSeconds != nil {
		errs = append(errs, bad(root+".terminationGracePeriodSeconds", "must not be set for readiness probes"))
	}
	if _, err := resolve(root, p, t); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func initialResult(k Kind) Result {
	switch k {
	case Readiness:
		return Failure
	case Liveness:
		return Success
	}
	return Unknown
}

func intOr(v int32, def int) int {
	if v <= 0 {
		return def
	}
	return int(v)
}

// Result returns the current thresholded result.
func (w *Worker) Result() Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.result
}

// Run probes until ctx ends or the worker has nothing left to do: a
// startup probe that is decided, or a liveness probe that failed. The first
// probe comes initialDelaySeconds after the container started (or right
// away if that is past), plus jitter if configured; then one every
// periodSeconds, skipping periods an attempt overran. Call Run once.
func (w *Worker) Run(ctx context.Context) {
	now := w.clock.Now()
	start := w.started
	if start.IsZero() {
		start = now
	}
	next := start.Add(w.initialDelay)
	if next.Before(now) {
		next = now
	}
	if w.jitter || (!w.agentUp.IsZero() && now.Sub(w.agentUp) < w.period) {
		next = next.Add(w.jitterDelay())
	}
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if d := next.Sub(w.clock.Now()); d > 0 {
			if timer == nil {
				timer = w.clock.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			select {
			case <-ctx.Done():
				return
			case <-timer.C():
			}
		} else if ctx.Err() != nil {
			return
		}
		r, msg := offloadDo(ctx, w.probe, w.target)
		if w.attempt != nil && ctx.Err() == nil {
			w.attempt(r)
		}
		if !w.observe(r, msg) || ctx.Err() != nil {
			return
		}
		next = next.Add(w.period)
		if now := w.clock.Now(); !next.After(now) {
			// The attempt overran whole periods: skip them, as a ticker
			// drops ticks.
			next = next.Add((now.Sub(next)/w.period + 1) * w.period)
		}
	}
}

// offloadDo runs Do on a goroutine of its own that ends with it. A
// probe's request grows the stack it runs on (an HTTP request, 8–16 KiB);
// the worker's own goroutine, which waits out the period between
// attempts, then keeps only the small stack of that wait. An agent has a
// worker for every probe of every pod.
func offloadDo(ctx context.Context, p *corev1.Probe, t Target) (Result, string) {
	var r Result
	var msg string
	done := make(chan struct{})
	go func() {
		defer close(done)
		r, msg = Do(ctx, p, t)
	}()
	<-done
	return r, msg
}

// jitterDelay returns a random part of one period.
func (w *Worker) jitterDelay() time.Duration {
	n := int64(w.period)
	r := w.rand(n)
	if r < 0 || r >= n {
		r = 0
	}
	return time.Duration(r)
}

// observe records one attempt's result, calls OnChange when the
// thresholded result changes, and reports whether to keep probing.
func (w *Worker) observe(r Result, msg string) bool {
	if r == Unknown {
		return true
	}
	if r == Success && msg != "" && w.onWarning != nil {
		w.onWarning(msg)
	}
	if r == w.last {
		w.run++
	} else {
		w.last, w.run = r, 1
	}
	if (r == Success && w.run < w.successThreshold) || (r == Failure && w.run < w.failureThreshold) {
		return true
	}
	w.mu.Lock()
	changed := w.result != r
	w.result = r
	w.mu.Unlock()
	if changed {
		w.onChange(r, msg)
	}
	switch w.kind {
	case Startup:
		return false
	case Liveness:
		return r != Failure
	}
	return true
}
