package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent/staticpods"
)

// storedPods returns the stored pods by name: their invalid mark ("" for a
// good pod) and UID.
func (f *fixture) storedPods(t *testing.T) map[string][2]string {
	t.Helper()
	recs, err := f.st.Pods().List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	for _, r := range recs {
		msg, _ := staticpods.Invalid(r.Object)
		out[r.Object.Name] = [2]string{msg, string(r.Object.UID)}
	}
	return out
}

// A pod with a bad spec is recorded, marked invalid, beside the good pod
// of its file; the status read from the store alone shows it Failed with
// reason InvalidPod and the field. Fixing its file replaces it with a good
// pod (a new UID). Breaking a good pod keeps its last good version.
func TestSyncManifestsRecordsInvalidPods(t *testing.T) {
	f := newFixture(t)
	f.write(t, "two.yaml", pod("good", "busybox:1")+"---\n"+pod("noimage", `""`))
	quantity := "apiVersion: v1\nkind: Pod\nmetadata: {name: qty}\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n    resources: {limits: {memory: %s}}\n"
	f.write(t, "qty.yaml", strings.Replace(quantity, "%s", "12Q", 1))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	got := f.storedPods(t)
	if len(got) != 3 || got["good-n1"][0] != "" ||
		got["noimage-n1"][0] != "spec.containers[0].image: is required (line 11)" ||
		!strings.HasPrefix(got["qty-n1"][0], `spec.containers[0].resources.limits.memory: invalid value "12Q": quantities must match`) {
		t.Fatalf("stored pods = %q", got)
	}
	s, err := ReadStatus(f.st)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range s.Pods {
		st := p.Status
		switch p.Name {
		case "good-n1":
			if st != nil {
				t.Fatalf("good pod has a status before any worker ran: %+v", st)
			}
		default:
			if st == nil || st.Phase != corev1.PodFailed || st.Reason != ReasonInvalidPod || st.Message != got[p.Name][0] {
				t.Fatalf("pod %s status = %+v", p.Name, st)
			}
		}
	}
	s, _ = f.agent.Status()
	// Files in name order, each error naming the file, document, pod and field.
	if errs := s.Agent.ManifestErrors; len(errs) != 2 ||
		!strings.HasPrefix(errs[0], `qty.yaml: document 1 (Pod qty): spec.containers[0].resources.limits.memory: invalid value "12Q"`) ||
		!strings.HasSuffix(errs[0], "(line 8) [pod recorded as Failed, reason InvalidPod; not run]") ||
		errs[1] != "two.yaml: document 2 (Pod noimage): spec.containers[0].image: is required (line 11) [pod recorded as Failed, reason InvalidPod; not run]" {
		t.Fatalf("manifest errors = %q", errs)
	}

	// Fixed: a good pod with a new UID; the others are untouched.
	f.write(t, "qty.yaml", strings.Replace(quantity, "%s", "12Mi", 1))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	fixed := f.storedPods(t)
	if fixed["qty-n1"][0] != "" || fixed["qty-n1"][1] == got["qty-n1"][1] || fixed["good-n1"] != got["good-n1"] || fixed["noimage-n1"] != got["noimage-n1"] {
		t.Fatalf("after the fix: %q, before: %q", fixed, got)
	}

	// Broken again: the good version that runs is kept, and the error said.
	f.write(t, "qty.yaml", strings.Replace(quantity, "%s", "lots", 1))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if again := f.storedPods(t); again["qty-n1"] != fixed["qty-n1"] {
		t.Fatalf("a bad edit replaced the good pod: %q", again["qty-n1"])
	}
	s, _ = f.agent.Status()
	found := false
	for _, e := range s.Agent.ManifestErrors {
		found = found || strings.HasPrefix(e, `qty.yaml: document 1 (Pod qty): spec.containers[0].resources.limits.memory: invalid value "lots"`) && strings.HasSuffix(e, "[the last good version of the pod is kept]")
	}
	if !found {
		t.Fatalf("manifest errors = %q", s.Agent.ManifestErrors)
	}

	// Removing the invalid pod's document removes it.
	f.write(t, "two.yaml", pod("good", "busybox:1"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	if final := f.storedPods(t); len(final) != 2 || final["noimage-n1"] != [2]string{} {
		t.Fatalf("pods = %q", final)
	}
}
