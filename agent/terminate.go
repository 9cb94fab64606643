package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The state kubelet gives a container that never ran, or whose end was
// not seen, when its pod is terminated.
const (
	reasonStatusUnknown  = "ContainerStatusUnknown"
	messageStatusUnknown = "The container could not be located when the pod was terminated"
	exitStatusUnknown    = 137
)

// Condition reasons of a terminated pod, as kubelet's.
const (
	reasonPodCompleted = "PodCompleted"
	reasonPodFailed    = "PodFailed"
)

// reportTerminated re-reads the pod's containers after they were stopped
// and journals the pod's terminal status, as kubelet's status manager
// does when it terminates a pod (TerminatePod, then getPhase for a
// terminal pod). A container that still runs (its stop failed) is an
// error: the status then shows it running and the worker tries again.
func (w *worker) reportTerminated(ctx context.Context, pod *corev1.Pod) error {
	cs, err := w.m.rt.List(ctx, w.uid)
	if err != nil {
		return fmt.Errorf("list containers after stopping them: %w", err)
	}
	byName := groupAttempts(cs)
	for _, c := range cs {
		if c.State == StateRunning {
			w.report(pod, byName)
			return fmt.Errorf("container %s still running after its stop", c.Labels[LabelContainer])
		}
	}
	// Nothing starts again: a container waiting to (crash-loop back-off,
	// image pull) shows how its last attempt ended instead.
	clear(w.waiting)
	st := w.computeStatus(pod, byName)
	w.terminalStatus(pod, &st)
	w.journalStatus(pod, st)
	return nil
}

// terminalStatus turns the status of a pod whose containers were all
// stopped into its final one:
//   - once the pod has initialized, a regular container with no recorded
//     end (it never ran, or its container is gone) is terminated with
//     exit code 137 and reason ContainerStatusUnknown, and so are the
//     init containers before the last one that ran; the others keep
//     waiting, as kubelet leaves them;
//   - the phase is Succeeded when every regular container exited 0 and
//     Failed otherwise (kubelet's getPhase for a terminal pod, and its
//     TerminatePod for a pod that was still Pending or Running);
//   - the readiness conditions are False, with kubelet's reasons.
func (w *worker) terminalStatus(pod *corev1.Pod, st *corev1.PodStatus) {
	if podHasInitialized(pod, st) {
		for i := range st.ContainerStatuses {
			unknownIfNotTerminated(&st.ContainerStatuses[i])
		}
	}
	// kubelet's initializedContainers: up to the last init container that
	// shows a start, and at least the first.
	inits := st.InitContainerStatuses
	n := min(len(inits), 1)
	for i := len(inits) - 1; i >= 0; i-- {
		if inits[i].State.Waiting == nil || inits[i].LastTerminationState.Terminated != nil {
			n = i + 1
			break
		}
	}
	for i := range inits[:n] {
		unknownIfNotTerminated(&inits[i])
	}

	st.Phase = corev1.PodFailed
	if len(st.ContainerStatuses) > 0 {
		succeeded := true
		for _, cs := range st.ContainerStatuses {
			if t := cs.State.Terminated; t == nil || t.ExitCode != 0 {
				succeeded = false
			}
		}
		if succeeded {
			st.Phase = corev1.PodSucceeded
		}
	}

	reason := reasonPodFailed
	if st.Phase == corev1.PodSucceeded {
		reason = reasonPodCompleted
	}
	now := metav1.NewTime(w.m.clock.Now().Truncate(time.Second))
	for i := range st.Conditions {
		c := &st.Conditions[i]
		switch c.Type {
		case corev1.ContainersReady, corev1.PodReady:
			c.Status, c.Reason, c.Message = corev1.ConditionFalse, reason, ""
		case corev1.PodReadyToStartContainers:
			c.Status, c.Reason, c.Message = corev1.ConditionFalse, "", ""
		default:
			continue
		}
		c.LastTransitionTime = w.transitionTime(c.Type, c.Status, now)
	}
}

// podHasInitialized reports whether the pod got past its init containers:
// kubelet's hasPodInitialized, over the status being built.
func podHasInitialized(pod *corev1.Pod, st *corev1.PodStatus) bool {
	if len(pod.Spec.InitContainers) == 0 {
		return true
	}
	for _, cs := range st.ContainerStatuses {
		if cs.LastTerminationState.Terminated != nil || cs.State.Waiting == nil {
			return true
		}
	}
	if n := len(st.InitContainerStatuses); n > 0 {
		last := st.InitContainerStatuses[n-1]
		for _, t := range []*corev1.ContainerStateTerminated{last.State.Terminated, last.LastTerminationState.Terminated} {
			if t != nil && t.ExitCode == 0 {
				return true
			}
		}
	}
	return false
}

func unknownIfNotTerminated(cs *corev1.ContainerStatus) {
	if cs.State.Terminated != nil {
		return
	}
	cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: exitStatusUnknown, Reason: reasonStatusUnknown, Message: messageStatusUnknown,
	}}
	cs.Ready = false
	started := false
	cs.Started = &started
}
