package agent

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Admission reasons kubelet gives a pod it refuses to run on this node.
const (
	reasonSysctlForbidden = "SysctlForbidden"
	reasonOSNotSupported  = "PodOSNotSupported"
)

// rejection is why a pod must never be run on this node: the status
// reason and message it is Failed with.
type rejection struct{ reason, msg string }

// safeSysctls are kubelet's safe sysctls: namespaced, and with no effect on
// any other pod. A pod may set these and no others. The ones that need a
// newer kernel than 4.15 (tcp_slow_start_after_idle, tcp_notsent_lowat)
// are on every kernel the boards run.
var safeSysctls = map[string]string{
	"kernel.shm_rmid_forced":              "ipc",
	"net.ipv4.ip_local_port_range":        "net",
	"net.ipv4.tcp_syncookies":             "net",
	"net.ipv4.ping_group_range":           "net",
	"net.ipv4.ip_unprivileged_port_start": "net",
	"net.ipv4.ip_local_reserved_ports":    "net",
	"net.ipv4.tcp_keepalive_time":         "net",
	"net.ipv4.tcp_fin_timeout":            "net",
	"net.ipv4.tcp_keepalive_intvl":        "net",
	"net.ipv4.tcp_keepalive_probes":       "net",
	"net.ipv4.tcp_rmem":                   "net",
	"net.ipv4.tcp_wmem":                   "net",
	"net.ipv4.tcp_slow_start_after_idle":  "net",
	"net.ipv4.tcp_notsent_lowat":          "net",
}

// admit is kubelet's admission of a pod on a Linux node: a pod for
// another OS is refused (PodOSNotSupported), and so is a pod that sets a
// sysctl that is not safe, or a safe one in a namespace it shares with the
// host (SysctlForbidden). The message is kubelet's, with its "Pod was
// rejected: " prefix.
func admit(pod *corev1.Pod) (rejection, bool) {
	if pod.Spec.OS != nil && pod.Spec.OS.Name != "" && pod.Spec.OS.Name != corev1.Linux {
		return rejection{reasonOSNotSupported, "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS"}, false
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		for _, s := range sc.Sysctls {
			if err := checkSysctl(pod, s.Name); err != nil {
				return rejection{reasonSysctlForbidden, "Pod was rejected: forbidden sysctl: " + err.Error()}, false
			}
		}
	}
	return rejection{}, true
}

func checkSysctl(pod *corev1.Pod, name string) error {
	name = normalizeSysctl(name)
	ns, ok := safeSysctls[name]
	switch {
	case !ok:
		return fmt.Errorf("%q not allowlisted", name)
	case ns == "net" && pod.Spec.HostNetwork:
		return fmt.Errorf("%q not allowed with host net enabled", name)
	case ns == "ipc" && pod.Spec.HostIPC:
		return fmt.Errorf("%q not allowed with host ipc enabled", name)
	}
	return nil
}

// normalizeSysctl turns a sysctl written with slashes (kernel/shm_rmid_forced,
// net/ipv4/conf/eno2.100/rp_filter) into its dotted name, swapping dots and
// slashes as kubelet does, so a dot inside a slashed name survives as a
// slash.
func normalizeSysctl(name string) string {
	if i := strings.IndexAny(name, "./"); i < 0 || name[i] == '.' {
		return name
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, name)
}

// podSysctls is the pod's sysctls by dotted name, for its containers' specs.
func podSysctls(pod *corev1.Pod) map[string]string {
	sc := pod.Spec.SecurityContext
	if sc == nil || len(sc.Sysctls) == 0 {
		return nil
	}
	out := make(map[string]string, len(sc.Sysctls))
	for _, s := range sc.Sysctls {
		out[normalizeSysctl(s.Name)] = s.Value
	}
	return out
}
