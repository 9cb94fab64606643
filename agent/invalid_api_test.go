package agent_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/store"
)

// A pod from the API server (no manifest, so no invalid mark) that this
// node cannot run is Failed with reason InvalidPod and a message naming
// the field, and nothing is done for it in the runtime; a good API pod
// beside it runs.
func TestInvalidAPIPodIsFailedAndNeverRun(t *testing.T) {
	h := newHarness(t)
	good := newPod("good", corev1.RestartPolicyAlways, ctr("app"))
	bad := newPod("nfs", corev1.RestartPolicyAlways, ctr("app"))
	bad.Spec.Containers[0].Image = "remote:1"
	bad.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "data", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nas", Path: "/x"}}},
	}
	h.rt.AddToRegistry("remote:1")
	for _, p := range []*corev1.Pod{good, bad} {
		if err := h.st.Pods().Put(store.SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	h.start()
	want := "spec.volumes[1].nfs: nfs volumes are not supported on this node"
	h.eventually("good running, bad Failed", func() bool {
		return h.running(id(good, "app", 0)) && h.phase(bad) == corev1.PodFailed
	})
	st, seq, _ := h.status(bad)
	if st.Reason != agent.ReasonInvalidPod || st.Message != want || len(st.ContainerStatuses) != 0 {
		t.Fatalf("status = %q %q %+v, want %q %q and no containers", st.Reason, st.Message, st.ContainerStatuses, agent.ReasonInvalidPod, want)
	}
	for range 3 {
		h.advance(10 * time.Second)
	}
	if _, again, _ := h.status(bad); again != seq {
		t.Fatalf("unchanged invalid status journaled again: seq %d -> %d", seq, again)
	}
	for _, c := range h.rt.Calls() {
		if strings.Contains(c, string(bad.UID)[:12]) || strings.Contains(c, "remote:1") {
			t.Fatalf("runtime call %q for the invalid pod", c)
		}
	}
}
