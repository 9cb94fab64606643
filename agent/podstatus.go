package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/agent/staticpods"
)

// JournalKey is the journal key of a pod's status.
func JournalKey(namespace, name string) string { return "pod/" + namespace + "/" + name }

// ReasonInvalidPod is the status reason of a pod whose spec is bad or asks
// for what this node cannot provide (see staticpods.AnnotationInvalid and
// staticpods.Validate), whatever its source. Like a pod kubelet rejects at
// admission, it is Failed from the start and never run: no sandbox, no
// image pull, no container. Its status message names every bad field.
const ReasonInvalidPod = "InvalidPod"

// invalid returns why pod must never be run, if it must not: the mark a
// manifest's pod carries (staticpods.Invalid), or else, for a pod of any
// source, what staticpods.Validate finds, or else what this node does not
// admit (admit: another OS, a forbidden sysctl). The result is kept for
// the pod object it was computed for: syncDesired hands the worker a new
// object only when the pod changed, so an unchanged pod is not checked
// again on every sync. Called only from the worker's goroutine.
func (w *worker) invalid(pod *corev1.Pod) (rejection, bool) {
	if msg, invalid := staticpods.Invalid(pod); invalid {
		return rejection{ReasonInvalidPod, msg}, true
	}
	if pod != w.checked {
		w.checked, w.badSpec = pod, rejection{}
		if err := staticpods.Validate(pod); err != nil {
			w.badSpec = rejection{ReasonInvalidPod, err.Error()}
		} else if r, ok := admit(pod); !ok {
			w.badSpec = r
		}
	}
	return w.badSpec, w.badSpec.reason != ""
}

// rejected reports whether pod is invalid and, if so, records it as
// Failed with the reason and message, once per change, and journals its
// status. The worker then does nothing else for it.
func (w *worker) rejected(pod *corev1.Pod) bool {
	r, invalid := w.invalid(pod)
	if !invalid {
		return false
	}
	if w.getState() != LifecycleFailed {
		w.log.Warn("pod rejected", "reason", r.reason, "msg", r.msg)
		w.m.events.record(pod, "Warning", r.reason, r.msg)
	}
	w.setState(LifecycleFailed)
	w.report(pod, nil)
	return true
}

// invalidStatus is the status of a pod that is never run: Failed, with
// the reason and message kubelet gives a pod it rejects, and no container
// statuses.
func invalidStatus(pod *corev1.Pod, r rejection, hostIP string) corev1.PodStatus {
	st := corev1.PodStatus{
		Phase: corev1.PodFailed, Reason: r.reason, Message: r.msg,
		QOSClass: QoSClass(pod), HostIP: hostIP,
	}
	if hostIP != "" {
		st.HostIPs = []corev1.HostIP{{IP: hostIP}}
	}
	return st
}

// report computes the pod's status like kubelet and, when it changed,
// writes it to the journal. Only transitions reach the disk.
func (w *worker) report(pod *corev1.Pod, byName map[string]attempts) {
	w.journalStatus(pod, w.computeStatus(pod, byName))
}

// journalStatus records st as the pod's status and journals it when it
// changed.
func (w *worker) journalStatus(pod *corev1.Pod, st corev1.PodStatus) {
	w.mu.Lock()
	w.status = st
	w.mu.Unlock()
	entry := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, Status: st}
	data, err := entry.Marshal()
	if err != nil {
		w.log.Error("encode pod status", "err", err)
		return
	}
	if bytes.Equal(data, w.lastSent) {
		return
	}
	if _, err := w.m.store.Append(JournalKey(pod.Namespace, pod.Name), data); err != nil {
		// Kept in w.status, and journaled at the next sync that finds
		// the store writable again.
		w.log.Log(context.Background(), storeErrLevel(err), "journal pod status", "err", err)
		return
	}
	w.lastSent = data
}

func (w *worker) computeStatus(pod *corev1.Pod, byName map[string]attempts) corev1.PodStatus {
	if r, invalid := w.invalid(pod); invalid {
		st := invalidStatus(pod, r, w.m.cfg.HostIP)
		now := metav1.NewTime(w.m.clock.Now().Truncate(1e9))
		st.Conditions = []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionTrue,
			LastTransitionTime: w.transitionTime(corev1.PodScheduled, corev1.ConditionTrue, now),
		}}
		return st
	}
	st := corev1.PodStatus{QOSClass: QoSClass(pod), HostIP: w.m.cfg.HostIP}
	if w.m.cfg.HostIP != "" {
		st.HostIPs = []corev1.HostIP{{IP: w.m.cfg.HostIP}}
	}
	if !w.startTime.IsZero() {
		t := w.startTime
		st.StartTime = &t
	}
	if ip := w.podIP(); ip != "" && w.ready {
		st.PodIP = ip
		st.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	// As kubelet: in a pod with init containers, a container not created
	// yet, init or not, waits with PodInitializing.
	hasInit := len(pod.Spec.InitContainers) > 0
	podInitializing := func(cs *corev1.ContainerStatus) {
		if hasInit && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ContainerCreating" {
			cs.State.Waiting.Reason = "PodInitializing"
		}
	}
	var incomplete []string // init containers that did not succeed (or, sidecars, start) yet
	var unready []string    // sidecars and containers not ready
	sidecarsRunning := 0
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cs := w.containerStatus(pod, c, byName[c.Name])
		podInitializing(&cs)
		switch {
		case isSidecar(c):
			// As kubelet: a sidecar has initialized once it started; it is
			// ready by its readiness probe, and counts for the pod's.
			if cs.Started == nil || !*cs.Started {
				incomplete = append(incomplete, c.Name)
			}
			if !cs.Ready {
				unready = append(unready, c.Name)
			}
			if cs.State.Running != nil {
				sidecarsRunning++
			}
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			cs.Ready = true // as kubelet: an init container that succeeded is ready
		default:
			incomplete = append(incomplete, c.Name)
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	initDone := len(incomplete) == 0
	allReady, running, succeeded, failed, waiting := len(unready) == 0, 0, 0, 0, 0
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := w.containerStatus(pod, c, byName[c.Name])
		podInitializing(&cs)
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			allReady = false
		}
		term := cs.State.Terminated
		if cs.State.Waiting != nil {
			// Waiting to restart after it ended: kubelet counts it as stopped.
			term = cs.LastTerminationState.Terminated
			if term == nil {
				waiting++ // never ran yet
			}
		}
		if cs.State.Waiting == nil || cs.LastTerminationState.Terminated != nil {
			// As kubelet: once a regular container has run, the pod has
			// initialized, whatever its sidecars do since.
			initDone = true
		}
		switch {
		case cs.State.Running != nil:
			running++
		case term != nil && term.ExitCode == 0:
			succeeded++
		case term != nil:
			failed++
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, w.containerStatus(pod, &c, byName[c.Name]))
	}
	switch w.getState() {
	case LifecycleSucceeded:
		st.Phase = corev1.PodSucceeded
	case LifecycleFailed:
		st.Phase = corev1.PodFailed
		st.Reason, st.Message = w.failReason, w.failMessage
	default:
		// As kubelet's getPhase: a container that has not run yet keeps
		// the pod Pending, even while others run.
		if waiting == 0 && running+sidecarsRunning > 0 || (waiting == 0 && initDone && succeeded+failed > 0 && len(pod.Spec.Containers) > 0 && running+succeeded+failed == len(pod.Spec.Containers)) {
			st.Phase = corev1.PodRunning
		} else {
			st.Phase = corev1.PodPending
		}
	}
	now := metav1.NewTime(w.m.clock.Now().Truncate(1e9))
	cond := func(t corev1.PodConditionType, ok bool, reason, message string) {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message}
		if ok {
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, "", ""
		}
		c.LastTransitionTime = w.transitionTime(t, c.Status, now)
		st.Conditions = append(st.Conditions, c)
	}
	ready := allReady && initDone && st.Phase == corev1.PodRunning
	// The reasons and messages are kubelet's (pkg/kubelet/status's
	// Generate*Condition), which clients and tests read.
	initReason, initMsg := "ContainersNotInitialized", ""
	if !initDone {
		initMsg = fmt.Sprintf("containers with incomplete status: %s", incomplete)
	}
	readyReason, readyMsg := "ContainersNotReady", ""
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready {
			unready = append(unready, cs.Name)
		}
	}
	if len(unready) > 0 {
		readyMsg = fmt.Sprintf("containers with unready status: %s", unready)
	}
	if st.Phase == corev1.PodSucceeded {
		initDone, initReason, initMsg = true, "PodCompleted", ""
		readyReason, readyMsg = "PodCompleted", ""
	}
	cond(corev1.PodReadyToStartContainers, w.ready, "", "")
	cond(corev1.PodInitialized, initDone, initReason, initMsg)
	if st.Phase == corev1.PodSucceeded {
		// kubelet keeps the reason on the True condition of a finished pod.
		st.Conditions[len(st.Conditions)-1].Reason = "PodCompleted"
	}
	cond(corev1.ContainersReady, ready, readyReason, readyMsg)
	if ready {
		if msg := readinessGates(pod); msg != "" {
			cond(corev1.PodReady, false, "ReadinessGatesNotReady", msg)
		} else {
			cond(corev1.PodReady, true, "", "")
		}
	} else {
		cond(corev1.PodReady, false, readyReason, readyMsg)
	}
	cond(corev1.PodScheduled, true, "", "")
	return st
}

// readinessGates says which of the pod's readiness gates keep it from
// being ready, as kubelet's GeneratePodReadyCondition does, from the gate
// conditions stored with the pod (store.DesiredPodStatus); "" when none.
func readinessGates(pod *corev1.Pod) string {
	var msgs []string
	for _, g := range pod.Spec.ReadinessGates {
		var c *corev1.PodCondition
		for i := range pod.Status.Conditions {
			if pod.Status.Conditions[i].Type == g.ConditionType {
				c = &pod.Status.Conditions[i]
			}
		}
		switch {
		case c == nil:
			msgs = append(msgs, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", g.ConditionType))
		case c.Status != corev1.ConditionTrue:
			msgs = append(msgs, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", g.ConditionType, c.Status))
		}
	}
	return strings.Join(msgs, ", ")
}

// transitionTime keeps a condition's last transition time while its
// status stays the same.
func (w *worker) transitionTime(t corev1.PodConditionType, s corev1.ConditionStatus, now metav1.Time) metav1.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.status.Conditions {
		if c.Type == t && c.Status == s {
			return c.LastTransitionTime
		}
	}
	return now
}

func (w *worker) containerStatus(pod *corev1.Pod, c *corev1.Container, a attempts) corev1.ContainerStatus {
	// As kubelet's prober manager: started is always set, false unless
	// the container runs and its startup probe (if any) passed.
	notStarted := false
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Started: &notStarted}
	if wt, ok := w.waiting[c.Name]; ok && (len(a) == 0 || a[0].State != StateRunning) {
		wt := wt
		cs.State.Waiting = &wt
	}
	if len(a) == 0 {
		if cs.State.Waiting == nil {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		if st, ok, _ := w.m.store.Restart(w.uid, c.Name); ok {
			cs.RestartCount = st.Count
		}
		return cs
	}
	latest := a[0]
	cs.RestartCount = int32(attemptOf(latest))
	cs.ContainerID = "containerd://" + latest.ID
	cs.ImageID = latest.Labels[LabelImageRef]
	switch latest.State {
	case StateRunning:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(latest.StartedAt)}
		ready, started := true, true
		if ps := w.probes[latest.ID]; ps != nil {
			ready, started = ps.snapshot()
		} else {
			ready, started = c.ReadinessProbe == nil, c.StartupProbe == nil
		}
		cs.Ready, cs.Started = ready, &started
	case StateExited:
		term := w.terminated(pod, c, latest)
		if cs.State.Waiting == nil {
			cs.State.Terminated = term
		} else {
			cs.LastTerminationState.Terminated = term
		}
		f := false
		cs.Started = &f
	case StateCreated:
		if cs.State.Waiting == nil {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
	}
	if len(a) > 1 && a[1].State == StateExited && cs.LastTerminationState.Terminated == nil {
		cs.LastTerminationState.Terminated = w.terminated(pod, c, a[1])
	}
	return cs
}

func (w *worker) terminated(pod *corev1.Pod, c *corev1.Container, ct Container) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{
		ExitCode: ct.ExitCode, StartedAt: metav1.NewTime(ct.StartedAt), FinishedAt: metav1.NewTime(ct.FinishedAt),
		ContainerID: "containerd://" + ct.ID, Reason: ct.Reason,
	}
	if t.Reason == "" {
		t.Reason = "Completed"
		if ct.ExitCode != 0 {
			t.Reason = "Error"
		}
	}
	t.Message = w.terminationMessage(pod, c, ct)
	return t
}

// terminationMessage reads the container's termination message file, or
// with FallbackToLogsOnError the tail of its log when it failed.
func (w *worker) terminationMessage(pod *corev1.Pod, c *corev1.Container, ct Container) string {
	const maxMsg = 4096
	if b, err := os.ReadFile(filepath.Join(w.m.podDir(w.uid), "containers", c.Name, "termination-log")); err == nil && len(b) > 0 {
		if len(b) > maxMsg {
			b = b[:maxMsg]
		}
		return string(b)
	}
	if c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && ct.ExitCode != 0 {
		b, err := os.ReadFile(ct.Labels[LabelLogPath])
		if err != nil {
			return ""
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		var out []string
		for _, l := range lines {
			if _, rest, ok := strings.Cut(l, " "); ok {
				if _, rest, ok = strings.Cut(rest, " "); ok {
					if _, rest, ok = strings.Cut(rest, " "); ok {
						out = append(out, rest)
					}
				}
			}
		}
		msg := strings.Join(out, "\n")
		if len(msg) > maxMsg {
			msg = msg[len(msg)-maxMsg:]
		}
		return msg
	}
	return ""
}
