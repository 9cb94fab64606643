package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod's hostname is kubelet's: spec.hostname, else its name, at most
// 63 characters (sethostname refuses more) without a trailing - or .
func TestPodHostnameAsKubeletMakesIt(t *testing.T) {
	long := "termination-message-container53f1825a-6681-44a1-8ef2-8cd93eb954a2"
	for _, tc := range []struct {
		name, hostname, want string
	}{
		{"web", "", "web"},
		{"web", "db-0", "db-0"},
		{long, "", long[:63]},
		{strings.Repeat("a", 62) + "-b", "", strings.Repeat("a", 62)},
		{strings.Repeat("a", 61) + ".-b", "", strings.Repeat("a", 61)},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: corev1.PodSpec{Hostname: tc.hostname}}
		if got := podHostname(p); got != tc.want {
			t.Errorf("pod %q hostname %q: %q, want %q", tc.name, tc.hostname, got, tc.want)
		}
	}
}
