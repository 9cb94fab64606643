package agent

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent/prober"
	"github.com/outpost-edge/outpost/internal/promtext"
)

// podMetrics are the pod manager's counters; the rest of the pod families
// are read from the workers when written.
type podMetrics struct {
	probes    [3][3]atomic.Uint64 // attempts by prober.Kind and prober.Result
	syncs     atomic.Uint64       // worker syncs
	syncNanos atomic.Int64        // and their total time
}

// probe counts one probe attempt.
func (m *podMetrics) probe(k prober.Kind, r prober.Result) {
	if k >= 0 && int(k) < len(m.probes) && r >= 0 && int(r) < len(m.probes[k]) {
		m.probes[k][r].Add(1)
	}
}

// observeSync counts one worker sync that took d.
func (m *podMetrics) observeSync(d time.Duration) {
	m.syncs.Add(1)
	m.syncNanos.Add(int64(d))
}

// podFacts is what the metrics need of one pod worker.
type podFacts struct {
	namespace, name string
	state           Lifecycle
	phase           corev1.PodPhase // "" while the pod is gone or has no status yet
	containers      []containerFacts
}

type containerFacts struct {
	name     string
	state    string // waiting, running, terminated or ""
	restarts int32
	ready    bool
}

// metricsFacts reads every worker's pod: those being removed too (their
// state is Terminating), but only the phase and containers of pods that
// are still desired, as views does.
func (m *podManager) metricsFacts() []podFacts {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]podFacts, 0, len(m.workers))
	for _, w := range m.workers {
		w.mu.Lock()
		f := podFacts{namespace: w.last.Namespace, name: w.last.Name, state: w.state}
		if w.desired != nil {
			f.phase = w.status.Phase
			for _, cs := range [][]corev1.ContainerStatus{w.status.InitContainerStatuses, w.status.ContainerStatuses} {
				for _, c := range cs {
					f.containers = append(f.containers, containerFacts{name: c.Name, state: containerState(c.State), restarts: c.RestartCount, ready: c.Ready})
				}
			}
		}
		w.mu.Unlock()
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b podFacts) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	return out
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return "terminated"
	case s.Waiting != nil:
		return "waiting"
	}
	return ""
}

// WriteMetrics writes the agent's families: manifest errors always; when
// the agent runs pods, pods by lifecycle state and by phase, containers
// by state, each container's restarts and readiness, probe attempts by
// probe type and result, and the time pod workers spend syncing.
func (a *Agent) WriteMetrics(p *promtext.Writer) {
	a.mu.Lock()
	nerr := len(a.manifestErrors)
	a.mu.Unlock()
	p.Family("outpost_manifest_errors", "Problems with the static pod manifests as last read (a file that does not parse, an invalid pod).", promtext.Gauge)
	p.Sample("outpost_manifest_errors", float64(nerr))
	if a.pods != nil {
		a.pods.writeMetrics(p)
	}
}

var (
	metricLifecycles      = []Lifecycle{LifecyclePending, LifecycleRunning, LifecycleSucceeded, LifecycleFailed, LifecycleTerminating}
	metricPhases          = []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown}
	metricContainerStates = []string{"waiting", "running", "terminated"}
	metricProbeKinds      = []prober.Kind{prober.Liveness, prober.Readiness, prober.Startup}
	metricProbeResults    = []prober.Result{prober.Success, prober.Failure, prober.Unknown}
)

func (m *podManager) writeMetrics(p *promtext.Writer) {
	pods := m.metricsFacts()
	byState := map[Lifecycle]int{}
	byPhase := map[corev1.PodPhase]int{}
	byCState := map[string]int{}
	for _, f := range pods {
		byState[f.state]++
		if f.phase != "" {
			byPhase[f.phase]++
		}
		for _, c := range f.containers {
			byCState[c.state]++
		}
	}
	p.Family("outpost_pods", "Pods the agent runs, by lifecycle state (pods being removed are Terminating).", promtext.Gauge)
	for _, s := range metricLifecycles {
		p.Sample("outpost_pods", float64(byState[s]), "state", s.String())
	}
	p.Family("outpost_pods_by_phase", "Desired pods by the phase of their status; a pod with no status computed yet is not counted.", promtext.Gauge)
	for _, ph := range metricPhases {
		p.Sample("outpost_pods_by_phase", float64(byPhase[ph]), "phase", string(ph))
	}
	p.Family("outpost_containers", "Containers (init containers included) of the desired pods, by state.", promtext.Gauge)
	for _, s := range metricContainerStates {
		p.Sample("outpost_containers", float64(byCState[s]), "state", s)
	}
	p.Family("outpost_container_restarts_total", "Restarts of each container of the desired pods.", promtext.Counter)
	for _, f := range pods {
		for _, c := range f.containers {
			p.Sample("outpost_container_restarts_total", float64(c.restarts), "namespace", f.namespace, "pod", f.name, "container", c.name)
		}
	}
	p.Family("outpost_container_ready", "Whether each container of the desired pods is ready (1) or not (0): its readiness probe's current result.", promtext.Gauge)
	for _, f := range pods {
		for _, c := range f.containers {
			p.Sample("outpost_container_ready", metricBool(c.ready), "namespace", f.namespace, "pod", f.name, "container", c.name)
		}
	}
	p.Family("outpost_probe_total", "Container probe attempts, by probe type and result (unknown: the attempt errored).", promtext.Counter)
	for _, k := range metricProbeKinds {
		for _, r := range metricProbeResults {
			p.Sample("outpost_probe_total", float64(m.metrics.probes[k][r].Load()), "probe_type", k.String(), "result", r.String())
		}
	}
	p.Family("outpost_pod_worker_duration_seconds", "Time pod workers spent syncing their pods, in seconds, and the number of syncs.", promtext.Summary)
	p.Sample("outpost_pod_worker_duration_seconds_sum", time.Duration(m.metrics.syncNanos.Load()).Seconds())
	p.Sample("outpost_pod_worker_duration_seconds_count", float64(m.metrics.syncs.Load()))
}

func metricBool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
