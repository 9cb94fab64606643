package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A spare is a container's next attempt, made ahead and not started:
// its record and its snapshot in the runtime, from the same spec the
// next attempt would have. Once a container has run a while, its worker
// makes one (makeSpares). When the container ends, or the node loses its
// power and boots with no network, the next attempt needs only its task:
// after a reboot the 30 creates, each a snapshot and a record written to
// the runtime's store, are done already while containerd is busiest.
//
// A spare is used only when the spec the next attempt would have now is
// the one it was made from, on a runtime with the same settings
// (spareKey): a config map or image changed meanwhile makes the attempt
// anew, as kubelet would make it. Until started, a spare is no attempt:
// it is in no status, and the pod's removal removes it with the rest.

// isSpare reports whether c is a spare: made ahead and never started.
func isSpare(c Container) bool {
	return c.State == StateCreated && c.Labels[LabelSpare] != ""
}

// sparesOf returns the spares among a pod's containers, by container name.
func sparesOf(cs []Container) map[string]Container {
	var out map[string]Container
	for _, c := range cs {
		if isSpare(c) {
			if out == nil {
				out = map[string]Container{}
			}
			out[c.Labels[LabelContainer]] = c
		}
	}
	return out
}

// spareKey identifies what a container made from spec would be: the spec
// (but for whether its image was pulled) and the runtime's settings.
func (w *worker) spareKey(spec ContainerSpec) string {
	spec.Labels = maps.Clone(spec.Labels)
	delete(spec.Labels, LabelSpare)
	spec.Image.Pulled = false
	b, err := json.Marshal(spec)
	if err != nil {
		return "" // no key: no spare is made or used
	}
	h := sha256.New()
	h.Write([]byte(w.m.rt.SpareKey()))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// useSpare reports whether the container's spare is the container spec
// asks for, made from the same spec on the same runtime: then it is
// started as it is. A spare made from another spec is removed, for the
// attempt to be made anew.
func (w *worker) useSpare(ctx context.Context, name string, spec ContainerSpec) (bool, error) {
	sp, ok := w.spares[name]
	if !ok || sp.ID != spec.ID {
		return false, nil
	}
	delete(w.spares, name)
	if key := w.spareKey(spec); key != "" && sp.Labels[LabelSpare] == key {
		return true, nil
	}
	w.log.Info("spare made from another spec; making the attempt anew", "container", name, "id", sp.ID)
	if err := w.m.rt.Remove(ctx, sp.ID); err != nil {
		return false, fmt.Errorf("remove spare %s: %w", sp.ID, err)
	}
	return false, nil
}

// spareRetry is how soon a worker looks again to make a spare while
// another worker makes one.
const spareRetry = 100 * time.Millisecond

// makeSpares makes the spare of each container of the running pod that
// has run SpareAfter and would be started again when it ends: its
// sidecars, and its regular containers unless its restart policy is
// Never. It returns when to look again, 0 for no need.
func (w *worker) makeSpares(ctx context.Context, pod *corev1.Pod, byName map[string]attempts) (next time.Duration) {
	if w.m.cfg.SpareAfter <= 0 {
		return 0
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; isSidecar(c) {
			next = earliest(next, w.makeSpare(ctx, pod, c, true, byName[c.Name]))
		}
	}
	if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
		return next
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		next = earliest(next, w.makeSpare(ctx, pod, c, false, byName[c.Name]))
	}
	return next
}

// makeSpare makes c's spare once its running attempt has run SpareAfter,
// and returns when to look again, 0 for no need. A spare that could not
// be made is not tried again for the same attempt.
func (w *worker) makeSpare(ctx context.Context, pod *corev1.Pod, c *corev1.Container, isInit bool, a attempts) time.Duration {
	if len(a) == 0 || a[0].State != StateRunning {
		return 0
	}
	attempt := attemptOf(a[0]) + 1
	id := containerID(w.uid, c.Name, attempt)
	sp, has := w.spares[c.Name]
	if has && sp.ID == id || w.noSpare[c.Name] == id {
		return 0
	}
	if ran := w.m.clock.Now().Sub(a[0].StartedAt); ran < w.m.cfg.SpareAfter {
		return w.m.cfg.SpareAfter - ran
	}
	// One spare at a time on the node: the pods' containers, started
	// together, would otherwise make theirs together, a burst of creates
	// and of the agent's heap for work that can wait. A worker that finds
	// another making one looks again soon rather than wait.
	if !w.m.spareMu.TryLock() {
		return spareRetry
	}
	defer w.m.spareMu.Unlock()
	made, err := w.createSpare(ctx, pod, c, isInit, attempt)
	if err == nil && has {
		// The spare of an attempt that is not the next one any more.
		err = w.m.rt.Remove(ctx, sp.ID)
	}
	if err != nil {
		w.log.Warn("spare not made", "container", c.Name, "id", id, "err", err)
		if w.noSpare == nil {
			w.noSpare = map[string]string{}
		}
		w.noSpare[c.Name] = id
		return 0
	}
	if w.spares == nil {
		w.spares = map[string]Container{}
	}
	w.spares[c.Name] = made
	w.log.Debug("spare made", "container", c.Name, "id", id)
	return 0
}

// createSpare creates the container of c's attempt as a spare, from its
// image as the node has it (a spare never pulls), and returns it as the
// runtime would list it.
func (w *worker) createSpare(ctx context.Context, pod *corev1.Pod, c *corev1.Container, isInit bool, attempt int) (Container, error) {
	img, err := w.m.rt.EnsureImage(ctx, c.Image, corev1.PullNever)
	if err != nil {
		return Container{}, err
	}
	spec, err := w.containerSpec(ctx, pod, c, isInit, attempt, img)
	if err != nil {
		return Container{}, err
	}
	key := w.spareKey(spec)
	if key == "" {
		return Container{}, fmt.Errorf("no key for the spec of %s", spec.ID)
	}
	spec.Labels[LabelSpare] = key
	if err := w.m.rt.Create(ctx, spec); err != nil {
		return Container{}, err
	}
	return Container{ID: spec.ID, Labels: spec.Labels, State: StateCreated}, nil
}
