package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/staticpods"
	"github.com/outpost-edge/outpost/store"
)

// invalidManifest has a good pod and one whose spec is bad (no image, a
// volume mount of no volume); its bad pod's image would have to be pulled.
const invalidManifest = `apiVersion: v1
kind: Pod
metadata: {name: good}
spec:
  containers: [{name: app, image: "busybox:1", command: [sleep, inf]}]
---
apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  containers:
  - name: app
    image: remote:1
    volumeMounts: [{name: data, mountPath: /data}]
  - name: side
`

// parsePods returns the pods of a manifest as SyncManifests records them.
func parsePods(t *testing.T, file, src string) []*corev1.Pod {
	t.Helper()
	m := staticpods.Parse(file, []byte(src), "n1")
	if len(m.Errors) > 0 {
		t.Fatalf("manifest errors: %v", m.Errors)
	}
	return m.Pods
}

// An invalid pod is Failed from its first status, with the reason and the
// fields, and nothing is done for it in the runtime: no pull, no create,
// no pod directory. The good pod of the same file runs. It stays so across
// an agent restart, and a fixed manifest (a new UID) replaces it with a
// running pod.
func TestInvalidPodIsFailedAndNeverRun(t *testing.T) {
	h := newHarness(t)
	h.rt.AddToRegistry("remote:1")
	pods := parsePods(t, "app.yaml", invalidManifest)
	good, bad := pods[0], pods[1]
	h.put(good, bad)
	h.start()
	wantMsg := `spec.containers[0].volumeMounts[0].name: "data" is not a volume of the pod (spec.volumes) (line 14); spec.containers[1].image: is required (line 15)`
	check := func(when string) {
		t.Helper()
		h.eventually(when+": good running, bad Failed", func() bool {
			return h.running(id(good, "app", 0)) && h.phase(good) == corev1.PodRunning && h.phase(bad) == corev1.PodFailed
		})
		st, _, _ := h.status(bad)
		if st.Reason != agent.ReasonInvalidPod || st.Message != wantMsg {
			t.Fatalf("%s: reason %q message\n%q\nwant %q\n%q", when, st.Reason, st.Message, agent.ReasonInvalidPod, wantMsg)
		}
		if len(st.ContainerStatuses) != 0 || st.StartTime != nil || st.PodIP != "" {
			t.Fatalf("%s: invalid pod's status has run-time state: %+v", when, st)
		}
		for _, c := range h.rt.Calls() {
			if strings.Contains(c, string(bad.UID)[:12]) || strings.Contains(c, "remote:1") {
				t.Fatalf("%s: runtime call %q for the invalid pod; calls: %q", when, c, h.rt.Calls())
			}
		}
		if _, err := os.Stat(filepath.Join(h.dir, "pods", string(bad.UID))); !os.IsNotExist(err) {
			t.Fatalf("%s: invalid pod got a pod directory: %v", when, err)
		}
		v, ok := h.m.Views()[string(bad.UID)]
		if !ok || v.State != agent.LifecycleFailed || v.Status.Reason != agent.ReasonInvalidPod {
			t.Fatalf("%s: view = %+v", when, v)
		}
		if evs := h.m.Events(string(bad.UID)); len(evs) != 1 || evs[0].Reason != agent.ReasonInvalidPod || evs[0].Message != wantMsg {
			t.Fatalf("%s: events = %+v", when, evs)
		}
	}
	check("first run")
	_, seq, _ := h.status(bad)
	// Resyncs change nothing and journal nothing new.
	for range 3 {
		h.advance(10 * time.Second)
	}
	if _, again, _ := h.status(bad); again != seq {
		t.Fatalf("unchanged invalid status journaled again: seq %d -> %d", seq, again)
	}

	// The invalid pod is kept in the store as such: after a restart it is
	// still Failed and still never run.
	h.stopManager()
	rec, found, err := h.st.Pods().Get(bad.Namespace, bad.Name)
	if err != nil || !found {
		t.Fatalf("invalid pod not in the store: %v", err)
	}
	if msg, invalid := staticpods.Invalid(rec.Object); !invalid || msg != wantMsg {
		t.Fatalf("stored pod lost its mark: %v %q", invalid, msg)
	}
	n := h.clk.syncs()
	h.start()
	h.synced(n, "restarted manager synced", func() bool { return true })
	check("after a restart")

	// The manifest is fixed: a new UID, run like any pod; the invalid one
	// is gone and its journal entry (same name) shows the new pod.
	fixedSrc := strings.Replace(invalidManifest, "    volumeMounts: [{name: data, mountPath: /data}]\n", "", 1)
	fixedSrc = strings.Replace(fixedSrc, "  - name: side\n", "  - {name: side, image: busybox:1, command: [sleep, inf]}\n", 1)
	fixed := parsePods(t, "app.yaml", fixedSrc)
	if len(fixed) != 2 || fixed[1].UID == bad.UID {
		t.Fatalf("fixed manifest: %d pods, uid %s (was %s)", len(fixed), fixed[1].UID, bad.UID)
	}
	if _, invalid := staticpods.Invalid(fixed[1]); invalid {
		t.Fatalf("fixed pod still invalid: %s", fixed[1].Annotations[staticpods.AnnotationInvalid])
	}
	if _, err := h.st.Pods().Replace(store.SourceStatic, fixed); err != nil {
		t.Fatal(err)
	}
	h.rt.AddImage("remote:1")
	h.eventually("fixed pod running", func() bool {
		var got corev1.Pod
		e, ok := h.entries()[agent.JournalKey(bad.Namespace, bad.Name)]
		_, oldWorker := h.m.Views()[string(bad.UID)]
		return ok && got.Unmarshal(e.Value) == nil && got.UID == fixed[1].UID && got.Status.Phase == corev1.PodRunning && got.Status.Reason == "" &&
			h.running(id(fixed[1], "app", 0)) && h.running(id(fixed[1], "side", 0)) && !oldWorker
	})
}
