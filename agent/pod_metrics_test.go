package agent_test

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// podMetrics writes the pod manager's families, and returns them without
// the worker sync summary (how many syncs there were depends on timing),
// and that summary's count and sum.
func (h *harness) podMetrics() (text string, syncs, seconds float64) {
	h.t.Helper()
	var b strings.Builder
	p := promtext.New(&b)
	h.m.WriteMetrics(p)
	if err := p.Flush(); err != nil {
		h.t.Fatal(err)
	}
	var keep []string
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if !strings.Contains(line, "outpost_pod_worker_duration_seconds") {
			keep = append(keep, line)
			continue
		}
		if v, ok := strings.CutPrefix(line, "outpost_pod_worker_duration_seconds_count "); ok {
			syncs, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(line, "outpost_pod_worker_duration_seconds_sum "); ok {
			seconds, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return strings.Join(keep, ""), syncs, seconds
}

func TestPodMetrics(t *testing.T) {
	h := newHarness(t)
	web := newPod("web", corev1.RestartPolicyAlways, ctr("app"))
	web.Spec.Containers[0].ReadinessProbe = execReadiness(1)
	job := newPod("job", corev1.RestartPolicyNever, ctr("run"))
	h.rt.SetExec(func(context.Context, string, []string) (int, []byte, error) { return 0, nil, nil })
	h.put(web, job)
	h.start()
	h.synced(0, "containers running", func() bool { return h.running(id(web, "app", 0)) && h.running(id(job, "run", 0)) })
	h.advance(100 * time.Millisecond) // the workers look again to start the probes
	h.synced(0, "web ready and job running", func() bool {
		return h.condition(web, corev1.PodReady) == corev1.ConditionTrue && h.running(id(job, "run", 0))
	})
	h.exit(id(job, "run", 0), 1, "job failed", func() bool { return h.phase(job) == corev1.PodFailed })

	got, syncs, seconds := h.podMetrics()
	want := `# HELP outpost_pods Pods the agent runs, by lifecycle state (pods being removed are Terminating).
# TYPE outpost_pods gauge
outpost_pods{state="Pending"} 0
outpost_pods{state="Running"} 1
outpost_pods{state="Succeeded"} 0
outpost_pods{state="Failed"} 1
outpost_pods{state="Terminating"} 0
# HELP outpost_pods_by_phase Desired pods by the phase of their status; a pod with no status computed yet is not counted.
# TYPE outpost_pods_by_phase gauge
outpost_pods_by_phase{phase="Pending"} 0
outpost_pods_by_phase{phase="Running"} 1
outpost_pods_by_phase{phase="Succeeded"} 0
outpost_pods_by_phase{phase="Failed"} 1
outpost_pods_by_phase{phase="Unknown"} 0
# HELP outpost_containers Containers (init containers included) of the desired pods, by state.
# TYPE outpost_containers gauge
outpost_containers{state="waiting"} 0
outpost_containers{state="running"} 1
outpost_containers{state="terminated"} 1
# HELP outpost_container_restarts_total Restarts of each container of the desired pods.
# TYPE outpost_container_restarts_total counter
outpost_container_restarts_total{namespace="default",pod="job",container="run"} 0
outpost_container_restarts_total{namespace="default",pod="web",container="app"} 0
# HELP outpost_container_ready Whether each container of the desired pods is ready (1) or not (0): its readiness probe's current result.
# TYPE outpost_container_ready gauge
outpost_container_ready{namespace="default",pod="job",container="run"} 0
outpost_container_ready{namespace="default",pod="web",container="app"} 1
# HELP outpost_probe_total Container probe attempts, by probe type and result (unknown: the attempt errored).
# TYPE outpost_probe_total counter
outpost_probe_total{probe_type="liveness",result="success"} 0
outpost_probe_total{probe_type="liveness",result="failure"} 0
outpost_probe_total{probe_type="liveness",result="unknown"} 0
outpost_probe_total{probe_type="readiness",result="success"} 1
outpost_probe_total{probe_type="readiness",result="failure"} 0
outpost_probe_total{probe_type="readiness",result="unknown"} 0
outpost_probe_total{probe_type="startup",result="success"} 0
outpost_probe_total{probe_type="startup",result="failure"} 0
outpost_probe_total{probe_type="startup",result="unknown"} 0
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// The summary reads the injected clock, which moved once, by 0.1 s:
	// a sync is timed 0 s, or 0.1 s if that step came while it ran (a
	// slow machine), never a wall-clock fraction.
	if steps := seconds / 0.1; syncs < 3 || math.Abs(steps-math.Round(steps)) > 1e-6 || steps > syncs+1e-6 {
		t.Errorf("%v worker syncs counted taking %v s; want at least one per pod and one after the exit, each timed 0 or 0.1 s on a clock that moved once by 0.1 s", syncs, seconds)
	}

	// A failing readiness probe, and a crash-looping container. The fake
	// clock moves in small steps until the container has restarted after
	// its backoff and the new instance's probe has failed: probe workers
	// arm timers too, so advance's count of worker syncs would not do.
	h.rt.SetExec(func(context.Context, string, []string) (int, []byte, error) { return 1, nil, nil })
	h.exit(id(web, "app", 0), 2, "app waits to restart", func() bool { return h.state(web, "app") == "waiting:CrashLoopBackOff" })
	sample := func(text, line string) float64 {
		for l := range strings.SplitSeq(text, "\n") {
			if v, ok := strings.CutPrefix(l, line+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return -1
	}
	const (
		restarts = `outpost_container_restarts_total{namespace="default",pod="web",container="app"}`
		ready    = `outpost_container_ready{namespace="default",pod="web",container="app"}`
		failures = `outpost_probe_total{probe_type="readiness",result="failure"}`
		success  = `outpost_probe_total{probe_type="readiness",result="success"}`
	)
	h.eventually("app restarted and its probe failed", func() bool {
		h.clk.Advance(100 * time.Millisecond)
		got, _, _ = h.podMetrics()
		return sample(got, restarts) == 1 && sample(got, failures) >= 1
	})
	if sample(got, ready) != 0 || sample(got, success) != 1 {
		t.Errorf("after the restart: %s %v, %s %v; want 0 and 1", ready, sample(got, ready), success, sample(got, success))
	}
}
