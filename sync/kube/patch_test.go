package kube

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/store"
)

var updatePatchGolden = flag.Bool("update-patch-golden", false, "rewrite testdata/patch-*.json from the current statusPatch")

var patchEpoch = metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))

// runningStatus is a full status of a running two-container pod, with
// every field the node owns set, plus fields it does not own.
func runningStatus() corev1.PodStatus {
	started := true
	return corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: patchEpoch},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: patchEpoch},
		},
		Message: "all good", Reason: "Fine",
		HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}},
		PodIP: "10.88.0.5", PodIPs: []corev1.PodIP{{IP: "10.88.0.5"}},
		StartTime: &patchEpoch,
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: "init", Image: "busybox:1", ContainerID: "containerd://i0",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: patchEpoch, FinishedAt: patchEpoch}},
		}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: "busybox:1", ContainerID: "containerd://a0", Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: patchEpoch}},
		}},
		EphemeralContainerStatuses: []corev1.ContainerStatus{{
			Name: "debug", Image: "busybox:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		}},
		// Not the node's: never sent.
		QOSClass: corev1.PodQOSBestEffort, NominatedNodeName: "other", ObservedGeneration: 3,
	}
}

func TestPatchGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   corev1.PodStatus
	}{
		// Every owned field set; qosClass, nominatedNodeName and
		// observedGeneration left out.
		{"running", runningStatus()},
		// A status with only a phase clears every other owned field.
		{"pending-cleared", corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable}},
		// An empty status clears them all.
		{"empty", corev1.PodStatus{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statusPatch("3f1c0a44-uid", &tc.st)
			if err != nil {
				t.Fatal(err)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, got, "", "  "); err != nil {
				t.Fatalf("patch is not JSON: %v\n%s", err, got)
			}
			pretty.WriteByte('\n')
			path := filepath.Join("testdata", "patch-"+tc.name+".json")
			if *updatePatchGolden {
				if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-patch-golden to write it)", err)
			}
			if !bytes.Equal(pretty.Bytes(), want) {
				t.Errorf("patch differs from %s:\ngot:\n%s\nwant:\n%s", path, pretty.Bytes(), want)
			}
		})
	}
}

// TestPatchClearsAbsentOwnedFields checks the property the golden files
// show, for each owned field alone: absent means an explicit null, and
// fields the node does not own are never in the patch.
func TestPatchClearsAbsentOwnedFields(t *testing.T) {
	st := runningStatus()
	full := patchStatusFields(t, &st)
	for _, f := range ownedStatusFields {
		if string(full[f]) == "null" {
			t.Errorf("owned field %s is null in the patch of a status that has it", f)
		}
	}
	for _, notOwned := range []string{"qosClass", "nominatedNodeName", "observedGeneration"} {
		if _, ok := full[notOwned]; ok {
			t.Errorf("patch sets %s, which the node does not own", notOwned)
		}
	}
	empty := patchStatusFields(t, &corev1.PodStatus{})
	if len(empty) != len(ownedStatusFields) {
		t.Errorf("patch of an empty status has %d fields, want the %d owned ones", len(empty), len(ownedStatusFields))
	}
	for _, f := range ownedStatusFields {
		if f == "conditions" {
			continue
		}
		if string(empty[f]) != "null" {
			t.Errorf("owned field %s is %s in the patch of an empty status, want null", f, empty[f])
		}
	}
	// Conditions merge by type: those of the node's that a status lacks
	// are deleted one by one, and others' are left alone.
	var conds []map[string]string
	if err := json.Unmarshal(empty["conditions"], &conds); err != nil {
		t.Fatal(err)
	}
	if len(conds) != len(ownedConditions) {
		t.Fatalf("conditions of an empty status = %s, want a delete for each of %v", empty["conditions"], ownedConditions)
	}
	for i, c := range conds {
		if c["$patch"] != "delete" || c["type"] != string(ownedConditions[i]) {
			t.Errorf("condition directive %d = %v, want a delete of %s", i, c, ownedConditions[i])
		}
	}
	// Lists are replaced whole.
	var ips []map[string]string
	if err := json.Unmarshal(full["podIPs"], &ips); err != nil {
		t.Fatal(err)
	}
	if len(ips) == 0 || ips[len(ips)-1]["$patch"] != "replace" {
		t.Errorf("podIPs = %s, want the IPs and a replace directive", full["podIPs"])
	}
}

func patchStatusFields(t *testing.T, st *corev1.PodStatus) map[string]json.RawMessage {
	t.Helper()
	b, err := statusPatch("u1", st)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Metadata map[string]string          `json:"metadata"`
		Status   map[string]json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Metadata["uid"] != "u1" || len(doc.Metadata) != 1 {
		t.Errorf("metadata = %v, want only the uid precondition", doc.Metadata)
	}
	return doc.Status
}

func TestPatchJournalPod(t *testing.T) {
	enc := func(ns, name string, uid types.UID) []byte {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		b, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name, key string
		value     []byte
		wantErr   string
	}{
		{"ok", "pod/default/web", enc("default", "web", "u1"), ""},
		{"not a pod key", "node/n1", enc("default", "web", "u1"), "not a pod status"},
		{"no name", "pod/default", enc("default", "web", "u1"), "key is not"},
		{"empty namespace", "pod//web", enc("", "web", "u1"), "key is not"},
		{"other pod", "pod/default/web", enc("default", "db", "u1"), "holds the status of pod default/db"},
		{"no uid", "pod/default/web", enc("default", "web", ""), "no pod uid"},
		{"garbage", "pod/default/web", []byte{0xff, 0xff, 0xff}, "journal entry pod/default/web"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := journalPod(store.Entry{Key: tc.key, Seq: 1, Value: tc.value})
			if tc.wantErr == "" {
				if err != nil || p.Name != "web" || p.UID != "u1" || p.Status.Phase != corev1.PodRunning {
					t.Fatalf("journalPod = %v, %v", p, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestPatchTerminalStatus(t *testing.T) {
	running := corev1.ContainerStatus{Name: "a", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	exited := corev1.ContainerStatus{Name: "a", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}
	waiting := corev1.ContainerStatus{Name: "a", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
	for _, tc := range []struct {
		name string
		st   corev1.PodStatus
		want bool
	}{
		{"succeeded", corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{exited}}, true},
		{"failed before init finished", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{waiting}}, true},
		{"running phase", corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{exited}}, false},
		{"pending phase", corev1.PodStatus{Phase: corev1.PodPending}, false},
		{"failed but a container runs", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{exited, running}}, false},
		{"failed but an init container runs", corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{running}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := terminalStatus(&tc.st); got != tc.want {
				t.Errorf("terminalStatus = %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzStatusPatch feeds journal bytes (outside input: another version's
// store, a damaged file) through the decoder and the patch builder: no
// panic, and every patch built is JSON holding exactly the uid
// precondition and the owned status fields.
func FuzzStatusPatch(f *testing.F) {
	for _, st := range []corev1.PodStatus{runningStatus(), {Phase: corev1.PodFailed, Reason: "InvalidPod", Message: "spec.containers[0].image: required"}, {}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}, Status: st}
		b, err := p.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add("pod/default/web", b)
	}
	f.Add("pod/default/web", []byte{0x0a, 0x03, 0x12, 0x01, 'x'})
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		patch, err := statusPatchOf(store.Entry{Key: key, Seq: 1, Value: value})
		if err != nil {
			return
		}
		p, err := journalPod(store.Entry{Key: key, Seq: 1, Value: value})
		if err != nil {
			t.Fatalf("statusPatchOf succeeded where journalPod fails: %v", err)
		}
		if !json.Valid(patch) {
			t.Fatalf("patch is not JSON: %q", patch)
		}
		var doc map[string]map[string]json.RawMessage
		if err := json.Unmarshal(patch, &doc); err != nil {
			t.Fatalf("patch %q: %v", patch, err)
		}
		if len(doc) != 2 || len(doc["metadata"]) != 1 {
			t.Fatalf("patch has more than metadata.uid and status: %s", patch)
		}
		var uid string
		if err := json.Unmarshal(doc["metadata"]["uid"], &uid); err != nil {
			t.Fatal(err)
		}
		if utf8.ValidString(string(p.UID)) && uid != string(p.UID) {
			t.Fatalf("uid precondition %q, want %q", uid, p.UID)
		}
		var keys []string
		for k := range doc["status"] {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := slices.Sorted(slices.Values(ownedStatusFields))
		if !slices.Equal(keys, want) {
			t.Fatalf("status fields %v, want %v", keys, want)
		}
	})
}
