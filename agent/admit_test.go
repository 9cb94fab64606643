package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAdmitRefusesWhatKubeletRefuses(t *testing.T) {
	withSysctl := func(name string, hostNet bool) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: hostNet,
			SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: name, Value: "1"}}}}}
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		reason string
		msg    string
	}{
		{"no sysctls", &corev1.Pod{}, "", ""},
		{"linux", &corev1.Pod{Spec: corev1.PodSpec{OS: &corev1.PodOS{Name: corev1.Linux}}}, "", ""},
		{"windows", &corev1.Pod{Spec: corev1.PodSpec{OS: &corev1.PodOS{Name: corev1.Windows}}}, reasonOSNotSupported, "OS field doesn't match"},
		{"safe", withSysctl("kernel.shm_rmid_forced", false), "", ""},
		{"safe with slashes", withSysctl("net/ipv4/ip_local_port_range", false), "", ""},
		{"unsafe", withSysctl("kernel.msgmax", false), reasonSysctlForbidden, `forbidden sysctl: "kernel.msgmax" not allowlisted`},
		{"net with host network", withSysctl("net.ipv4.tcp_syncookies", true), reasonSysctlForbidden, "not allowed with host net enabled"},
	} {
		r, ok := admit(tc.pod)
		if ok != (tc.reason == "") || r.reason != tc.reason || !strings.Contains(r.msg, tc.msg) {
			t.Errorf("%s: admit = %+v, %v; want reason %q with %q", tc.name, r, ok, tc.reason, tc.msg)
		}
		if !ok && !strings.HasPrefix(r.msg, "Pod was rejected: ") {
			t.Errorf("%s: message %q lacks kubelet's prefix", tc.name, r.msg)
		}
	}
}

func TestNormalizeSysctl(t *testing.T) {
	for in, want := range map[string]string{
		"kernel.shm_rmid_forced":           "kernel.shm_rmid_forced",
		"kernel/shm_rmid_forced":           "kernel.shm_rmid_forced",
		"net/ipv4/conf/eno2.100/rp_filter": "net.ipv4.conf.eno2/100.rp_filter",
		"net.ipv4.conf.eno2/100.rp_filter": "net.ipv4.conf.eno2/100.rp_filter",
		"plain":                            "plain",
	} {
		if got := normalizeSysctl(in); got != want {
			t.Errorf("normalizeSysctl(%q) = %q, want %q", in, got, want)
		}
	}
}
