package main

import (
	"bytes"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
)

// An invalid pod shows as Failed in the table, and with its reason and the
// bad field when shown alone.
func TestStatusShowsInvalidPodReasonAndMessage(t *testing.T) {
	p := agent.PodInfo{
		Namespace: "default", Name: "bad-n1", UID: "u1", Source: "static", Containers: 1,
		Status: &corev1.PodStatus{Phase: corev1.PodFailed, Reason: agent.ReasonInvalidPod, Message: "spec.containers[0].image: is required (line 9)"},
	}
	var table bytes.Buffer
	if err := printStatus(&table, agent.Status{Node: "n1", From: "store", Pods: []agent.PodInfo{p}}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^default +bad-n1 +static +Failed +0/1 `).Match(table.Bytes()) {
		t.Fatalf("table:\n%s", table.String())
	}
	var one bytes.Buffer
	if err := printPod(&one, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`(?m)^STATUS +Failed$`, `(?m)^REASON +InvalidPod$`, `(?m)^MESSAGE +spec\.containers\[0\]\.image: is required \(line 9\)$`} {
		if !regexp.MustCompile(want).Match(one.Bytes()) {
			t.Errorf("pod lacks %s:\n%s", want, one.String())
		}
	}
}
