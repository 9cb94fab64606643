package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr(s string) *string { return &s }

// A pod's hostname is kubelet's: spec.hostnameOverride, else
// spec.hostname, else its name, at most
// 63 characters (sethostname refuses more) without a trailing - or .
func TestPodHostnameAsKubeletMakesIt(t *testing.T) {
	long := "termination-message-container53f1825a-6681-44a1-8ef2-8cd93eb954a2"
	for _, tc := range []struct {
		name, hostname, want string
		override             *string
	}{
		{name: "web", hostname: "db-0", want: "override.example.host", override: ptr("override.example.host")},
		{"web", "", "web", nil},
		{"web", "db-0", "db-0", nil},
		{long, "", long[:63], nil},
		{strings.Repeat("a", 62) + "-b", "", strings.Repeat("a", 62), nil},
		{strings.Repeat("a", 61) + ".-b", "", strings.Repeat("a", 61), nil},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: corev1.PodSpec{Hostname: tc.hostname, HostnameOverride: tc.override}}
		if got := podHostname(p); got != tc.want {
			t.Errorf("pod %q hostname %q: %q, want %q", tc.name, tc.hostname, got, tc.want)
		}
	}
}
