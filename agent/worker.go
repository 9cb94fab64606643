package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/agent/podenv"
	"github.com/outpost-edge/outpost/agent/prober"
	"github.com/outpost-edge/outpost/agent/staticpods"
	"github.com/outpost-edge/outpost/store"
)

// Lifecycle is where a pod is in its life on this node. The pod worker is
// its one owner.
type Lifecycle int

// Pod lifecycle states.
const (
	LifecyclePending     Lifecycle = iota // sandbox, images, init containers
	LifecycleRunning                      // regular containers started
	LifecycleSucceeded                    // every container exited 0, none restarts
	LifecycleFailed                       // a container failed and none restarts
	LifecycleTerminating                  // stopping its containers
	LifecycleRemoved                      // gone; the worker has exited
)

func (l Lifecycle) String() string {
	return [...]string{"Pending", "Running", "Succeeded", "Failed", "Terminating", "Removed"}[l]
}

// Backoff bounds, as kubelet's CrashLoopBackOff.
const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
	backoffReset   = 10 * time.Minute
	// resync is how often a worker re-reads its containers with no event,
	// kubelet's default sync frequency. Exits come as events and probe
	// results, store changes and backoff deadlines wake the worker, so
	// this is a safety net; each re-read is three calls to containerd per
	// container, the largest part of an idle agent's CPU at 10 s.
	resync = time.Minute
	// neverPullRetry is how often a container whose image must not be
	// pulled looks for it on the node, as kubelet retries a failed sync.
	neverPullRetry = 10 * time.Second
)

// worker owns one pod, by UID: one goroutine, woken by a buffered-1
// channel; the newest desired pod wins.
type worker struct {
	uid  string
	m    *podManager
	wake chan struct{}

	mu      sync.Mutex
	desired *corev1.Pod // nil once the pod is gone from the store
	last    *corev1.Pod // the newest non-nil desired pod, to stop it by its spec
	status  corev1.PodStatus
	state   Lifecycle
	// netnsPath is netns, for readers outside the worker (port-forward).
	netnsPath string

	// Owned by the worker goroutine.
	ip    netip.Addr
	netns string
	ready bool // sandbox set up
	// failReason and failMessage are the status reason and message of a
	// pod the worker failed on purpose (DeadlineExceeded).
	failReason, failMessage string
	// initialized: the init containers were done once, so only the
	// sidecars among them run again.
	initialized bool
	startTime   metav1.Time
	waiting     map[string]corev1.ContainerStateWaiting
	probes      map[string]*probeSet // by container ID
	probing     sync.WaitGroup       // the probe goroutines
	lastSent    []byte
	volErr      string                // the last volume refresh error, logged once
	pulls       map[string]*pullState // image pull backoff by image
	checked     *corev1.Pod           // the pod badSpec was computed for
	badSpec     rejection             // why checked must not be run; no reason if it may
	// spares are the containers' spares from the last list, by
	// container name; noSpare the attempt whose spare could not be made,
	// not tried again (see makeSpare).
	spares  map[string]Container
	noSpare map[string]string
	log     *slog.Logger
}

// probeSet is the probe workers of one running container.
type probeSet struct {
	cancel    context.CancelFunc
	mu        sync.Mutex
	ready     bool
	started   bool
	liveFail  bool
	liveMsg   string
	liveKind  prober.Kind // the probe that failed: Liveness or Startup
	hasReady  bool
	hasStart  bool
	readyOnce bool
}

func newWorker(m *podManager, pod *corev1.Pod) *worker {
	return &worker{
		uid: string(pod.UID), m: m, wake: make(chan struct{}, 1), desired: pod, last: pod,
		waiting: map[string]corev1.ContainerStateWaiting{}, probes: map[string]*probeSet{},
		log: m.log.With("pod", pod.Namespace+"/"+pod.Name, "uid", string(pod.UID)),
	}
}

// update hands the worker a newer desired pod (nil: the pod is gone) and
// wakes it.
func (w *worker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.desired = pod
	if pod != nil {
		w.last = pod
	}
	w.mu.Unlock()
	w.poke()
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run syncs the pod whenever it is woken, on backoff deadlines and every
// resync, until the pod is removed or ctx ends.
func (w *worker) run(ctx context.Context) {
	timer := w.m.clock.NewTimer(0)
	defer timer.Stop()
	defer func() {
		w.stopProbes("")
		w.probing.Wait()
	}()
	for {
		start := w.m.clock.Now()
		next, done := w.offloadSync(ctx)
		w.m.metrics.observeSync(w.m.clock.Since(start))
		if done {
			return
		}
		if next <= 0 || next > resync {
			next = resync
		}
		timer.Stop()
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer.C():
		}
	}
}

// offloadSync runs sync on a goroutine of its own that ends with it,
// while run waits: sync's calls to containerd (and the container spec
// it builds) grow the stack they run on to tens of KiB, and the
// goroutine of a worker, one for every pod, would keep that between its
// syncs, a minute apart when the pod is steady. The worker's state is
// still used by one goroutine at a time.
func (w *worker) offloadSync(ctx context.Context) (next time.Duration, done bool) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		next, done = w.sync(ctx)
	}()
	<-ch
	return next, done
}

// sync moves the pod one step towards its desired state and returns when
// it wants to be woken next; done means the pod is removed.
func (w *worker) sync(ctx context.Context) (next time.Duration, done bool) {
	w.mu.Lock()
	pod := w.desired
	w.mu.Unlock()
	if pod == nil || pod.DeletionTimestamp != nil {
		if err := w.terminate(ctx, pod); err != nil {
			w.log.Warn("terminate pod", "err", err)
			return time.Second, false
		}
		if pod == nil {
			w.setState(LifecycleRemoved)
			return 0, true
		}
		return resync, false
	}
	if w.rejected(pod) {
		return resync, false // an invalid pod is never run
	}
	cs, err := w.m.rt.List(ctx, w.uid)
	if err != nil {
		w.log.Warn("list containers", "err", err)
		return 2 * time.Second, false
	}
	byName := groupAttempts(cs)
	w.spares = sparesOf(cs)
	if w.startTime.IsZero() {
		w.startTime = metav1.NewTime(w.m.clock.Now().Truncate(time.Second))
		for _, c := range cs {
			if !c.CreatedAt.IsZero() && c.CreatedAt.Before(w.startTime.Time) {
				w.startTime = metav1.NewTime(c.CreatedAt.Truncate(time.Second))
			}
		}
	}
	next = resync
	if state := w.getState(); state == LifecycleSucceeded || state == LifecycleFailed {
		w.report(pod, byName)
		return resync, false
	}
	if left, ok := w.deadline(pod); ok && left <= 0 {
		// As kubelet: a pod active longer than its activeDeadlineSeconds
		// is stopped and Failed, whatever its restart policy.
		w.log.Info("pod past its active deadline; stopping it")
		w.m.events.record(pod, "Normal", reasonDeadlineExceeded, messageDeadlineExceeded)
		w.stopAll(ctx, pod, cs)
		w.stopProbes("")
		w.failReason, w.failMessage = reasonDeadlineExceeded, messageDeadlineExceeded
		w.setState(LifecycleFailed)
		if cs, err := w.m.rt.List(ctx, w.uid); err == nil {
			byName = groupAttempts(cs)
		}
		w.report(pod, byName)
		return resync, false
	} else if ok {
		next = left
	}
	if err := w.ensureSandbox(ctx, pod); err != nil {
		w.log.Warn("pod sandbox", "err", err)
		w.report(pod, byName)
		return 5 * time.Second, false
	}
	initDone, initFailed, n := w.syncInit(ctx, pod, byName)
	next = earliest(next, n)
	started := false
	if initFailed {
		w.stopSidecars(ctx, pod, byName)
		w.setState(LifecycleFailed)
	} else if initDone {
		var terminal Lifecycle
		n, terminal, started = w.syncContainers(ctx, pod, byName)
		next = earliest(next, n)
		if terminal != 0 {
			w.stopSidecars(ctx, pod, byName)
			w.setState(terminal)
		} else {
			w.setState(LifecycleRunning)
			next = earliest(next, w.syncEphemeral(ctx, pod, byName))
			w.refreshVolumes(ctx, pod)
		}
	}
	// Re-read after the changes above so status shows them, and start the
	// probes of the containers this sync started.
	cs, err = w.m.rt.List(ctx, w.uid)
	if err == nil {
		byName = groupAttempts(cs)
		w.spares = sparesOf(cs)
		w.gc(ctx, byName)
		if w.getState() == LifecycleRunning {
			next = earliest(next, w.makeSpares(ctx, pod, byName))
		}
	}
	if started && (err != nil || !w.probeStarted(ctx, pod, byName)) {
		next = earliest(next, 50*time.Millisecond) // look again at once
	}
	w.report(pod, byName)
	return next, false
}

// probeStarted starts the probes of the pod's running regular containers,
// as syncContainers would at the next sync, and reports whether each
// regular container that is not done has a running attempt.
func (w *worker) probeStarted(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) bool {
	all := true
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		a := byName[c.Name]
		switch {
		case len(a) > 0 && a[0].State == StateRunning:
			w.ensureProbes(ctx, pod, c, a[0])
		case len(a) > 0 && a[0].State == StateExited:
		default:
			all = false
		}
	}
	return all
}

// The status reason and message of a pod stopped at its active deadline,
// as kubelet's.
const (
	reasonDeadlineExceeded  = "DeadlineExceeded"
	messageDeadlineExceeded = "Pod was active on the node longer than the specified deadline"
)

// deadline returns how long the pod may still be active by its
// activeDeadlineSeconds, counted from its start time; ok is false when it
// has no deadline.
func (w *worker) deadline(pod *corev1.Pod) (left time.Duration, ok bool) {
	if pod.Spec.ActiveDeadlineSeconds == nil || w.startTime.IsZero() {
		return 0, false
	}
	end := w.startTime.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
	return end.Sub(w.m.clock.Now()), true
}

// refreshVolumes rewrites the running pod's content volumes from the
// store, so an edited config map or secret reaches its containers as in
// kubelet. A failure keeps the content they have; it is logged when it
// changes.
func (w *worker) refreshVolumes(ctx context.Context, pod *corev1.Pod) {
	if w.m.refreshVolumes == nil || !hasContentVolume(pod) {
		return
	}
	msg := ""
	if err := w.m.refreshVolumes(ctx, pod, w.podIP()); err != nil {
		msg = err.Error()
		if msg != w.volErr {
			w.log.Warn("refresh volumes", "err", err)
		}
	}
	w.volErr = msg
}

// hasContentVolume reports whether the pod has a volume whose content
// comes from the store: configMap, secret, downwardAPI or projected.
func hasContentVolume(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil {
			return true
		}
	}
	return false
}

func (w *worker) setState(s Lifecycle) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != s {
		w.log.Info("pod state", "from", w.state.String(), "to", s.String())
		w.state = s
	}
}

func (w *worker) getState() Lifecycle {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// attempts is a container's attempts, newest first.
type attempts []Container

// groupAttempts groups the pod's containers by name, newest attempt
// first, leaving out the spares: a spare is not an attempt until started.
func groupAttempts(cs []Container) map[string]attempts {
	out := map[string]attempts{}
	for _, c := range cs {
		if isSpare(c) {
			continue
		}
		name := c.Labels[LabelContainer]
		out[name] = append(out[name], c)
	}
	for _, a := range out {
		sort.Slice(a, func(i, j int) bool { return attemptOf(a[i]) > attemptOf(a[j]) })
	}
	return out
}

func attemptOf(c Container) int {
	n, _ := strconv.Atoi(c.Labels[LabelAttempt])
	return n
}

func hostNetwork(p *corev1.Pod) bool { return p.Spec.HostNetwork }

// ensureSandbox sets up the pod's network and directory once.
func (w *worker) ensureSandbox(ctx context.Context, pod *corev1.Pod) error {
	if w.ready {
		return nil
	}
	if !hostNetwork(pod) && w.m.net != nil {
		nsPath, ip, err := w.m.net.Setup(ctx, w.uid)
		if err != nil {
			return fmt.Errorf("network: %w", err)
		}
		w.netns, w.ip = nsPath, ip
		w.mu.Lock()
		w.netnsPath = nsPath
		w.mu.Unlock()
	}
	dir := w.m.podDir(w.uid)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := writeEtcFiles(dir, pod, w.m.cfg, w.podIP()); err != nil {
		return err
	}
	w.ready = true
	return nil
}

func (w *worker) podIP() string {
	if w.ip.IsValid() {
		return w.ip.String()
	}
	return w.m.cfg.HostIP
}

// syncInit runs the init containers in order, as kubelet does. A regular
// one must succeed before the next one starts. A restartable one (a
// sidecar: restartPolicy Always) must have started, its postStart hook
// done and its startup probe passed; it then runs beside the pod's
// containers, probed, and is restarted whenever it ends, whatever the
// pod's restart policy. Once the pod has initialized, its regular init
// containers are done for good and a sidecar that is down is restarted
// without holding anything back. It reports whether the pod has
// initialized, whether it failed for good, and when to look again.
func (w *worker) syncInit(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) (done, failed bool, next time.Duration) {
	initialized := w.initialized || regularStarted(pod, byName)
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		a := byName[c.Name]
		if isSidecar(c) {
			n, started := w.syncSidecar(ctx, pod, c, a)
			next = earliest(next, n)
			if !started && !initialized {
				return false, false, next
			}
			continue
		}
		if initialized {
			continue
		}
		if len(a) > 0 {
			latest := a[0]
			switch latest.State {
			case StateRunning:
				return false, false, next
			case StateExited:
				if latest.ExitCode == 0 {
					continue
				}
				if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
					return false, true, next
				}
			}
		}
		return false, false, earliest(next, w.startAttempt(ctx, pod, c, true, a))
	}
	w.initialized = true
	return true, false, next
}

// syncSidecar keeps a restartable init container running and probed. It
// reports when to look again and whether the container has started.
func (w *worker) syncSidecar(ctx context.Context, pod *corev1.Pod, c *corev1.Container, a attempts) (next time.Duration, started bool) {
	if len(a) > 0 && a[0].State == StateRunning {
		w.ensureProbes(ctx, pod, c, a[0])
		ps := w.probeSet(a[0].ID)
		if ps == nil {
			return 0, true // a probe that could not be built: as if it had none
		}
		if w.restartUnhealthy(ctx, pod, c, a[0], ps) {
			return time.Millisecond, false
		}
		_, started = ps.snapshot()
		return 0, started
	}
	if len(a) > 0 && a[0].State == StateExited {
		w.stopProbes(a[0].ID)
	}
	n := w.startAttempt(ctx, pod, c, true, a)
	if n == 0 {
		// Started, its postStart hook done: with no startup probe to
		// pass, the next container may start now. Look again soon to
		// start its probes.
		return 50 * time.Millisecond, c.StartupProbe == nil
	}
	return n, false
}

// restartUnhealthy stops a running container whose liveness or startup
// probe failed, with the probe's terminationGracePeriodSeconds when it
// sets one, and reports whether it did; the restart policy then decides.
func (w *worker) restartUnhealthy(ctx context.Context, pod *corev1.Pod, c *corev1.Container, running Container, ps *probeSet) bool {
	ps.mu.Lock()
	failed, msg, kind := ps.liveFail, ps.liveMsg, ps.liveKind
	ps.mu.Unlock()
	if !failed {
		return false
	}
	probe := c.LivenessProbe
	if kind == prober.Startup {
		probe = c.StartupProbe
	}
	grace := w.stopGrace(pod, running)
	if probe != nil && probe.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*probe.TerminationGracePeriodSeconds) * time.Second
	}
	w.log.Info(probeName(kind)+" probe failed; restarting container", "container", c.Name, "msg", msg)
	w.m.events.record(pod, "Warning", "Unhealthy", probeName(kind)+" probe failed: "+msg)
	w.m.events.record(pod, "Normal", "Killing", fmt.Sprintf("Container %s failed %s probe, will be restarted", c.Name, kind))
	w.stopContainer(ctx, pod, c, running, grace)
	w.stopProbes(running.ID)
	return true
}

// stopSidecars stops the pod's running sidecars in the reverse of their
// order, once its regular containers are done: a finished pod's sidecars
// do not keep it running.
func (w *worker) stopSidecars(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) {
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		c := &pod.Spec.InitContainers[i]
		if a := byName[c.Name]; isSidecar(c) && len(a) > 0 && a[0].State == StateRunning {
			w.stopContainer(ctx, pod, c, a[0], w.stopGrace(pod, a[0]))
			w.stopProbes(a[0].ID)
		}
	}
}

// syncEphemeral starts each of the running pod's ephemeral containers
// (kubectl debug) once, as kubelet does: one that ended is never
// restarted, and none is probed. It returns when to look again.
func (w *worker) syncEphemeral(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) (next time.Duration) {
	for i := range pod.Spec.EphemeralContainers {
		c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		if a := byName[c.Name]; len(a) == 0 || a[0].State == StateCreated {
			next = earliest(next, w.startAttempt(ctx, pod, &c, false, a))
		}
	}
	return next
}

// isSidecar reports whether an init container is restartable: it runs
// beside the pod's containers (restartPolicy Always).
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// regularStarted reports whether a regular container of the pod was ever
// created: then the pod had initialized (kubelet's hasPodInitialized).
func regularStarted(pod *corev1.Pod, byName map[string]attempts) bool {
	for i := range pod.Spec.Containers {
		if len(byName[pod.Spec.Containers[i].Name]) > 0 {
			return true
		}
	}
	return false
}

// earliest is the sooner of two wake-ups, 0 meaning none.
func earliest(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// syncContainers starts, restarts and probes the regular containers. It
// returns when to look again, when no container will run again
// LifecycleSucceeded or LifecycleFailed, and whether it started one (whose
// probes sync starts once it has read the container back).
func (w *worker) syncContainers(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) (next time.Duration, _ Lifecycle, started bool) {
	allDone, anyFailed := true, false
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		a := byName[c.Name]
		if len(a) > 0 && a[0].State == StateRunning {
			allDone = false
			w.ensureProbes(ctx, pod, c, a[0])
			if ps := w.probeSet(a[0].ID); ps != nil && w.restartUnhealthy(ctx, pod, c, a[0], ps) {
				next = time.Millisecond // restart decision right away
			}
			continue
		}
		if len(a) > 0 && a[0].State == StateExited {
			w.stopProbes(a[0].ID)
			if !shouldRestart(pod.Spec.RestartPolicy, a[0].ExitCode) {
				if a[0].ExitCode != 0 {
					anyFailed = true
				}
				continue
			}
		}
		allDone = false
		n := w.startAttempt(ctx, pod, c, false, a)
		if n == 0 {
			started = true
			continue
		}
		if next == 0 || n < next {
			next = n
		}
	}
	if allDone {
		if anyFailed {
			return next, LifecycleFailed, started
		}
		return next, LifecycleSucceeded, started
	}
	return next, 0, started
}

func shouldRestart(policy corev1.RestartPolicy, exit int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exit != 0
	}
	return true
}

// startAttempt starts the container's next attempt: the created one if an
// earlier start was cut short, else a new one after any crash-loop
// backoff. It returns how long to wait when backing off.
func (w *worker) startAttempt(ctx context.Context, pod *corev1.Pod, c *corev1.Container, isInit bool, a attempts) time.Duration {
	attempt := 0
	if len(a) > 0 {
		latest := a[0]
		if latest.State == StateCreated {
			if err := w.m.rt.Start(ctx, latest.ID); err != nil {
				w.setWaiting(c.Name, "RunContainerError", err.Error())
				return 5 * time.Second
			}
			w.clearWaiting(c.Name)
			return 0
		}
		attempt = attemptOf(latest) + 1
		if wait := w.backoff(pod, c, latest); wait > 0 {
			w.setWaiting(c.Name, "CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				w.backoffStep(c.Name), c.Name, pod.Name, pod.Namespace, pod.UID))
			return wait
		}
	} else if st, ok, _ := w.m.store.Restart(w.uid, c.Name); ok {
		attempt = int(st.Count) // containers gone (a reboot): keep counting
	}
	img, wait, ok := w.pullImage(ctx, pod, c)
	if !ok {
		return wait
	}
	spec, err := w.containerSpec(ctx, pod, c, isInit, attempt, img)
	var merr *mountError
	switch {
	case errors.As(err, &merr):
		// As kubelet: a volume that cannot be set up yet (a config map
		// not published yet in a new namespace) leaves the container
		// creating, and says why in an event; it is tried again soon.
		w.setWaiting(c.Name, "ContainerCreating", "")
		w.m.events.record(pod, "Warning", "FailedMount", merr.err.Error())
		return time.Second
	case err != nil:
		w.failed(pod, c, "CreateContainerConfigError", err)
		return 10 * time.Second
	}
	useSpare, err := w.useSpare(ctx, c.Name, spec)
	if err != nil {
		w.failed(pod, c, "CreateContainerError", err)
		return 5 * time.Second
	}
	if !useSpare {
		if err := w.m.rt.Create(ctx, spec); err != nil && !errors.Is(err, ErrExists) {
			w.failed(pod, c, "CreateContainerError", err)
			return 5 * time.Second
		}
	}
	if err := w.m.rt.Start(ctx, spec.ID); err != nil {
		w.failed(pod, c, "RunContainerError", err)
		return 5 * time.Second
	}
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		// As kubelet: the container is not started until its postStart hook
		// returns, and a failed hook kills it (then the restart policy).
		if err := w.runHook(ctx, c, c.Lifecycle.PostStart, spec.ID); err != nil {
			w.log.Warn("postStart hook failed; killing the container", "container", c.Name, "err", err)
			w.m.events.record(pod, "Warning", "FailedPostStartHook", fmt.Sprintf("PostStartHook failed: %v", err))
			if serr := w.m.rt.Stop(ctx, spec.ID, 2*time.Second); serr != nil {
				w.log.Warn("stop container", "id", spec.ID, "err", serr)
			}
			return time.Millisecond
		}
	}
	w.clearWaiting(c.Name)
	w.log.Info("container started", "container", c.Name, "attempt", attempt, "id", spec.ID)
	w.m.events.record(pod, "Normal", "Started", "Started container "+c.Name)
	return 0
}

// backoff returns how long the container must still wait before its next
// attempt, persisting the crash-loop state so it survives agent restarts:
// 10 s doubling to 5 min, reset after 10 min of running.
func (w *worker) backoff(pod *corev1.Pod, c *corev1.Container, latest Container) time.Duration {
	st, _, _ := w.m.store.Restart(w.uid, c.Name)
	finished := latest.FinishedAt
	if finished.IsZero() {
		finished = w.m.clock.Now()
	}
	// The state for this exit is computed once and stored.
	if st.LastFinished.Equal(finished) && st.Count == int32(attemptOf(latest)+1) {
		return max(st.BackoffUntil.Sub(w.m.clock.Now()), 0)
	}
	if latest.Reason == ReasonLost {
		// The container died with the node (a power cut), not by its own
		// fault: it comes back at once, and the restart still counts.
		st = store.RestartState{Count: int32(attemptOf(latest) + 1), LastExitCode: latest.ExitCode, LastFinished: finished, Backoff: st.Backoff}
		if err := w.m.store.PutRestart(w.uid, c.Name, st); err != nil {
			w.log.Log(context.Background(), storeErrLevel(err), "record restart state", "container", c.Name, "err", err)
		}
		return 0
	}
	step := time.Duration(st.Backoff)
	ran := finished.Sub(latest.StartedAt)
	switch {
	case step == 0 || (!latest.StartedAt.IsZero() && ran >= backoffReset):
		step = backoffInitial
	default:
		step = min(2*step, backoffMax)
	}
	if attemptOf(latest) == 0 && st.Backoff == 0 {
		step = backoffInitial
	}
	st = store.RestartState{
		Count: int32(attemptOf(latest) + 1), LastExitCode: latest.ExitCode, LastFinished: finished,
		BackoffUntil: finished.Add(step), Backoff: int64(step),
	}
	if err := w.m.store.PutRestart(w.uid, c.Name, st); err != nil {
		w.log.Log(context.Background(), storeErrLevel(err), "record restart state", "container", c.Name, "err", err)
	}
	if step > backoffInitial || attemptOf(latest) > 0 {
		w.m.events.record(pod, "Warning", "BackOff", "Back-off restarting failed container "+c.Name)
	}
	return max(st.BackoffUntil.Sub(w.m.clock.Now()), 0)
}

func (w *worker) backoffStep(name string) time.Duration {
	st, _, _ := w.m.store.Restart(w.uid, name)
	return time.Duration(st.Backoff)
}

// Image pull backoff, as kubelet's per pod and image: 10 s after a failed
// pull, doubling up to 5 min, forgotten when a pull succeeds or when no
// pull has failed for twice the maximum.
const (
	pullBackoffInitial = 10 * time.Second
	pullBackoffMax     = 5 * time.Minute
	// pullErrShown is how long ErrImagePull shows after a failed pull
	// before the worker looks again and shows ImagePullBackOff.
	pullErrShown = time.Second
)

// pullState is the backoff of one image of a pod after a failed pull.
type pullState struct {
	step   time.Duration // the current wait
	failed time.Time     // when the last pull failed
	err    string        // and why
}

// pullImage makes the container's image present according to its pull
// policy. When it cannot, it sets the container waiting as kubelet does
// (ErrImagePull on the failed pull, ImagePullBackOff while backing off,
// ErrImageNeverPull) and returns when to look again. An image that turns
// up during a backoff (imported from the image directory) ends it: a pod
// woken by the import starts at once.
func (w *worker) pullImage(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (Image, time.Duration, bool) {
	if w.pulls == nil {
		w.pulls = map[string]*pullState{}
	}
	now := w.m.clock.Now()
	if ps := w.pulls[c.Image]; ps != nil && now.Before(ps.failed.Add(ps.step)) {
		// PullNever looks only at the node's images, never the network.
		if _, err := w.m.rt.EnsureImage(ctx, c.Image, corev1.PullNever); err != nil {
			w.setWaiting(c.Name, "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", c.Image, ps.err))
			return Image{}, ps.failed.Add(ps.step).Sub(now), false
		}
	}
	img, err := w.m.rt.EnsureImage(ctx, c.Image, pullPolicy(c))
	switch {
	case err == nil:
		delete(w.pulls, c.Image)
		if img.Pulled {
			w.m.events.record(pod, "Normal", "Pulled", fmt.Sprintf("Successfully pulled image %q", c.Image))
		} else {
			w.m.events.record(pod, "Normal", "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))
		}
		return img, 0, true
	case errors.Is(err, ErrImageNeverPull):
		// Nothing to back off from: looking at the node's images is
		// cheap, and an import wakes the worker.
		if w.waiting[c.Name].Reason != "ErrImageNeverPull" {
			w.m.events.record(pod, "Warning", "ErrImageNeverPull", err.Error())
		}
		w.setWaiting(c.Name, "ErrImageNeverPull", err.Error())
		return Image{}, neverPullRetry, false
	}
	ps := w.pulls[c.Image]
	if ps == nil || now.Sub(ps.failed) > 2*pullBackoffMax {
		ps = &pullState{step: pullBackoffInitial}
	} else {
		ps.step = min(2*ps.step, pullBackoffMax)
	}
	ps.failed, ps.err = now, err.Error()
	w.pulls[c.Image] = ps
	w.setWaiting(c.Name, "ErrImagePull", err.Error())
	w.m.events.record(pod, "Warning", "Failed", err.Error())
	w.m.events.record(pod, "Normal", "BackOff", fmt.Sprintf("Back-off pulling image %q", c.Image))
	return Image{}, min(pullErrShown, ps.step), false
}

// pullPolicy is the container's image pull policy, defaulted as the
// Kubernetes API does when empty: Always for a ":latest" or untagged (and
// undigested) image, else IfNotPresent.
func pullPolicy(c *corev1.Container) corev1.PullPolicy {
	if c.ImagePullPolicy != "" {
		return c.ImagePullPolicy
	}
	return staticpods.DefaultPullPolicy(c.Image)
}

// failed leaves container c waiting with reason and posts kubelet's
// "Failed" event for it.
func (w *worker) failed(pod *corev1.Pod, c *corev1.Container, reason string, err error) {
	w.setWaiting(c.Name, reason, err.Error())
	w.m.events.record(pod, "Warning", "Failed", "Error: "+err.Error())
}

func (w *worker) setWaiting(name, reason, msg string) {
	if cur := w.waiting[name]; cur.Reason != reason {
		w.log.Info("container waiting", "container", name, "reason", reason, "msg", msg)
	}
	w.waiting[name] = corev1.ContainerStateWaiting{Reason: reason, Message: msg}
}

func (w *worker) clearWaiting(name string) { delete(w.waiting, name) }

// containerSpec builds the runtime spec of one attempt.
func (w *worker) containerSpec(ctx context.Context, pod *corev1.Pod, c *corev1.Container, isInit bool, attempt int, img Image) (ContainerSpec, error) {
	env, err := w.m.env(pod, c, w.podIP())
	if err != nil {
		return ContainerSpec{}, err
	}
	sec := security(pod, c)
	if err := checkNonRoot(pod, c, sec, img); err != nil {
		return ContainerSpec{}, err
	}
	mounts, err := w.mounts(ctx, pod, c)
	if err != nil {
		return ContainerSpec{}, &mountError{err}
	}
	vars := podenv.Lookup(env)
	args := processArgs(c, img)
	for i := range args {
		args[i] = podenv.Expand(args[i], vars)
	}
	id := containerID(w.uid, c.Name, attempt)
	hostname := podHostname(pod)
	if hostNetwork(pod) {
		hostname = ""
	}
	return ContainerSpec{
		ID: id,
		Labels: map[string]string{
			LabelPodUID: w.uid, LabelPodNamespace: pod.Namespace, LabelPodName: pod.Name,
			LabelContainer: c.Name, LabelAttempt: strconv.Itoa(attempt), LabelInit: strconv.FormatBool(isInit),
			LabelGracePeriod: strconv.FormatInt(gracePeriod(pod), 10),
		},
		Image: img, Args: args, Env: env, WorkingDir: c.WorkingDir, Hostname: hostname,
		Mounts: mounts, NetNSPath: w.netns, HostPID: pod.Spec.HostPID, HostIPC: pod.Spec.HostIPC,
		LogPath:      filepath.Join(w.m.logDir(pod), c.Name, strconv.Itoa(attempt)+".log"),
		CgroupParent: path.Join(w.m.cfg.CgroupParent, "pod"+w.uid),
		Resources:    resources(pod, c, QoSClass(pod), w.m.cfg.MemoryCapacity),
		Security:     sec,
		TTY:          c.TTY, Stdin: c.Stdin, StdinOnce: c.StdinOnce,
	}, nil
}

// mounts are the container's volume mounts plus the files every container
// gets: /etc/hosts, /etc/resolv.conf, /etc/hostname and its termination
// message file.
func (w *worker) mounts(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]specs.Mount, error) {
	var out []specs.Mount
	if w.m.volumes != nil {
		m, err := w.m.volumes(ctx, pod, c, w.podIP())
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	} else if len(c.VolumeMounts) > 0 {
		return nil, fmt.Errorf("container %s: volumes are not supported by this agent", c.Name)
	}
	dir := w.m.podDir(w.uid)
	bind := func(src, dst string, ro bool) {
		opts := []string{"rbind", "rprivate"}
		if ro {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: opts})
	}
	// As kubelet: a container that mounts its own /etc/hosts keeps it.
	ownHosts := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == "/etc/hosts" })
	if !ownHosts {
		bind(filepath.Join(dir, "etc-hosts"), "/etc/hosts", false)
	}
	if !hostNetwork(pod) {
		bind(filepath.Join(dir, "etc-hostname"), "/etc/hostname", false)
	}
	bind(filepath.Join(dir, "resolv.conf"), "/etc/resolv.conf", false)
	if c.TerminationMessagePath != "" {
		tdir := filepath.Join(dir, "containers", c.Name)
		if err := os.MkdirAll(tdir, 0o750); err != nil {
			return nil, err
		}
		f := filepath.Join(tdir, "termination-log")
		if err := os.WriteFile(f, nil, 0o666); err != nil {
			return nil, err
		}
		// Any user the container runs as may write it, whatever the umask.
		if err := os.Chmod(f, 0o666); err != nil {
			return nil, err
		}
		bind(f, c.TerminationMessagePath, false)
	}
	return out, nil
}

// gracePeriod is the pod's termination grace period in seconds.
func gracePeriod(pod *corev1.Pod) int64 {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return *pod.Spec.TerminationGracePeriodSeconds
	}
	return corev1.DefaultTerminationGracePeriodSeconds
}

// stopGrace is how long a running container of the pod gets to stop:
// the pod's deletionGracePeriodSeconds while it is deleted, else its
// terminationGracePeriodSeconds, else (the pod is gone) the period its
// container's label kept.
func (w *worker) stopGrace(pod *corev1.Pod, running Container) time.Duration {
	grace := 30 * time.Second
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	} else if v, err := strconv.ParseInt(running.Labels[LabelGracePeriod], 10, 64); err == nil && v >= 0 {
		grace = time.Duration(v) * time.Second
	}
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	return grace
}

// stopContainer runs the preStop hook and stops the container, all within
// grace. It leaves the container's probes to the caller: terminate stops
// containers in parallel.
func (w *worker) stopContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, running Container, grace time.Duration) {
	start := w.m.clock.Now()
	if c != nil && c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		hctx, cancel := context.WithTimeout(ctx, grace)
		err := w.runHook(hctx, c, c.Lifecycle.PreStop, running.ID)
		cancel()
		if err != nil {
			w.log.Warn("preStop hook failed", "container", c.Name, "err", err)
			w.m.events.record(pod, "Warning", "FailedPreStopHook", fmt.Sprintf("PreStopHook failed: %v", err))
		}
		grace = max(grace-w.m.clock.Since(start), minStopGrace)
	}
	if c != nil {
		w.m.events.record(pod, "Normal", "Killing", "Stopping container "+c.Name)
	}
	if err := w.m.rt.Stop(ctx, running.ID, grace); err != nil {
		w.log.Warn("stop container", "id", running.ID, "err", err)
	}
}

// terminate stops every container of the pod and, when the pod is gone
// (pod == nil), removes its containers, network and files. Containers stop
// by the pod's last spec (preStop hooks, grace period) even when the pod is
// gone; a pod being deleted (deletionTimestamp) stops with its
// deletionGracePeriodSeconds. A pod being deleted then has its terminal
// status journaled (reportTerminated): the API sink sends it, then
// deletes the pod for good, and the watch removes it from the store.
func (w *worker) terminate(ctx context.Context, pod *corev1.Pod) error {
	if pod != nil && w.getState() != LifecycleTerminating {
		// The terminal status is journaled even when it reads like one
		// sent before (a pod that had completed already): the sink needs
		// a status from after the deletion to finish it.
		w.lastSent = nil
	}
	w.setState(LifecycleTerminating)
	cs, err := w.m.rt.List(ctx, w.uid)
	if err != nil {
		return err
	}
	w.mu.Lock()
	last := w.last
	w.mu.Unlock()
	w.stopAll(ctx, last, cs)
	w.stopProbes("")
	if pod != nil {
		return w.reportTerminated(ctx, pod)
	}
	var errs []error
	for _, c := range cs {
		if err := w.m.rt.Remove(ctx, c.ID); err != nil {
			errs = append(errs, err)
		}
	}
	// The cgroups go before the volumes: their teardown removes the pod's
	// directory, the record by which an agent that died here finds at its
	// start what is left of the pod.
	if len(errs) == 0 && w.m.cgroups != nil {
		// Processes left in its cgroups (one that escaped its
		// container) are killed; one that outlives that is reported,
		// and does not keep the pod from being removed.
		if err := w.m.cgroups.RemovePod(w.uid); err != nil {
			w.log.Warn("pod cgroups left", "err", err)
		}
	}
	if w.m.net != nil {
		if err := w.m.net.Teardown(ctx, w.uid); err != nil {
			errs = append(errs, err)
		}
	}
	if w.m.teardownVolumes != nil {
		if err := w.m.teardownVolumes(w.uid); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		os.RemoveAll(w.m.podDir(w.uid))
		w.m.store.DeleteRestarts(w.uid)
		w.m.events.forget(w.uid)
		w.log.Info("pod removed")
	}
	return errors.Join(errs...)
}

// stopAll stops the pod's running containers as kubelet does: the regular
// ones at once, each with the pod's grace period, then the sidecars one by
// one in the reverse of their order, in what is left of it (at least 2 s),
// so a sidecar serves the others until they are gone.
func (w *worker) stopAll(ctx context.Context, pod *corev1.Pod, cs []Container) {
	start := w.m.clock.Now()
	var wg sync.WaitGroup
	sidecars := map[string]Container{}
	var grace time.Duration
	for _, c := range cs {
		if c.State != StateRunning {
			continue
		}
		g := w.stopGrace(pod, c)
		grace = g
		spec := findContainer(pod, c.Labels[LabelContainer])
		if spec != nil && isSidecar(spec) && c.Labels[LabelInit] == "true" {
			sidecars[spec.Name] = c
			continue
		}
		wg.Go(func() { w.stopContainer(ctx, pod, spec, c, g) })
	}
	wg.Wait()
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		spec := &pod.Spec.InitContainers[i]
		if c, ok := sidecars[spec.Name]; ok {
			left := max(grace-w.m.clock.Since(start), minStopGrace)
			w.stopContainer(ctx, pod, spec, c, left)
		}
	}
}

// minStopGrace is the least time a container is given to stop, kubelet's
// minimumGracePeriodInSeconds.
const minStopGrace = 2 * time.Second

// mountError is a container's volumes that could not be set up.
type mountError struct{ err error }

func (e *mountError) Error() string { return e.err.Error() }
func (e *mountError) Unwrap() error { return e.err }

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if pod.Spec.EphemeralContainers[i].Name == name {
			c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
			return &c
		}
	}
	return nil
}

// gc removes exited attempts older than the newest of each container; the
// newest dead one stays for `logs --previous`. An older attempt that is
// not exited is removed too: only the newest may run. An agent killed
// while containerd created an attempt's task can leave it for its
// successor to find gone (and the attempt lost with its task), and then
// containerd finishes the create behind the new attempt.
func (w *worker) gc(ctx context.Context, byName map[string]attempts) {
	for _, a := range byName {
		kept := 0
		for i, c := range a {
			switch {
			case i > 0 && c.State != StateExited:
				w.log.Warn("removing an older attempt that is not exited", "id", c.ID, "state", c.State, "newest", a[0].ID)
				if err := w.removeAttempt(ctx, c.ID); err != nil {
					w.log.Warn("remove older attempt", "id", c.ID, "err", err)
				}
			case c.State != StateExited:
			case kept < 1:
				kept++
			default:
				if err := w.removeAttempt(ctx, c.ID); err != nil {
					w.log.Debug("gc container", "id", c.ID, "err", err)
				}
			}
		}
	}
}

// removeAttempt removes one container of the pod, and then its cgroup.
func (w *worker) removeAttempt(ctx context.Context, id string) error {
	if err := w.m.rt.Remove(ctx, id); err != nil {
		return err
	}
	if w.m.cgroups != nil {
		if err := w.m.cgroups.RemoveContainer(w.uid, id); err != nil {
			w.log.Warn("container cgroup left", "id", id, "err", err)
		}
	}
	return nil
}

// ensureProbes starts the probe workers of a running container once.
func (w *worker) ensureProbes(ctx context.Context, pod *corev1.Pod, c *corev1.Container, running Container) {
	if _, ok := w.probes[running.ID]; ok {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	ps := &probeSet{cancel: cancel, ready: c.ReadinessProbe == nil, started: c.StartupProbe == nil,
		hasReady: c.ReadinessProbe != nil, hasStart: c.StartupProbe != nil}
	w.probes[running.ID] = ps
	target := prober.Target{
		Host:  w.podIP(),
		Ports: c.Ports,
		Exec: func(ctx context.Context, cmd []string) (int, []byte, error) {
			return w.m.rt.Exec(ctx, running.ID, cmd)
		},
	}
	start := func(kind prober.Kind, p *corev1.Probe, on func(prober.Result, string)) {
		pw, err := prober.NewWorker(prober.WorkerConfig{Kind: kind, Probe: p, Target: target, Started: running.StartedAt, Jitter: w.m.restarted(running), AgentStarted: w.m.started},
			prober.Deps{Clock: w.m.clock, Rand: w.m.rand, OnChange: on, OnAttempt: func(r prober.Result) { w.m.metrics.probe(kind, r) },
				OnWarning: func(msg string) {
					w.m.events.record(pod, "Warning", "ProbeWarning", fmt.Sprintf("%s probe warning: %s", probeName(kind), msg))
				}})
		if err != nil {
			w.log.Warn("bad probe", "container", c.Name, "err", err)
			return
		}
		if pctx.Err() != nil {
			return // the container's probes were stopped meanwhile
		}
		// Add runs on the worker's goroutine or on a running probe's (a
		// startup probe that succeeded), so never with the count at zero
		// while run waits.
		w.probing.Add(1)
		go func() {
			defer w.probing.Done()
			pw.Run(pctx)
		}()
	}
	startLiveReady := func() {
		if c.LivenessProbe != nil {
			start(prober.Liveness, c.LivenessProbe, func(r prober.Result, msg string) {
				ps.mu.Lock()
				ps.liveFail, ps.liveMsg, ps.liveKind = r == prober.Failure, msg, prober.Liveness
				ps.mu.Unlock()
				w.poke()
			})
		}
		if c.ReadinessProbe != nil {
			start(prober.Readiness, c.ReadinessProbe, func(r prober.Result, msg string) {
				ps.mu.Lock()
				ps.ready = r == prober.Success
				ps.mu.Unlock()
				if r == prober.Failure {
					w.m.events.record(pod, "Warning", "Unhealthy", "Readiness probe failed: "+msg)
				}
				w.poke()
			})
		}
	}
	if c.StartupProbe != nil {
		start(prober.Startup, c.StartupProbe, func(r prober.Result, msg string) {
			ps.mu.Lock()
			ps.started = r == prober.Success
			if r == prober.Failure {
				ps.liveFail, ps.liveMsg, ps.liveKind = true, msg, prober.Startup
			}
			ps.mu.Unlock()
			if r == prober.Success {
				startLiveReady()
			}
			w.poke()
		})
		return
	}
	startLiveReady()
}

func (w *worker) probeSet(id string) *probeSet { return w.probes[id] }

// probeName is kubelet's name of a probe kind in events: "Liveness".
func probeName(k prober.Kind) string {
	s := k.String()
	return strings.ToUpper(s[:1]) + s[1:]
}

func (ps *probeSet) liveFailed() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.liveFail
}

func (ps *probeSet) snapshot() (ready, started bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.ready, ps.started
}

// stopProbes cancels the probes of container id, or of every container
// when id is "".
func (w *worker) stopProbes(id string) {
	for cid, ps := range w.probes {
		if id == "" || cid == id {
			ps.cancel()
			delete(w.probes, cid)
		}
	}
}
