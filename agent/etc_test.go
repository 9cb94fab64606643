package agent

import (
	"os"
	"path/filepath"
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

func TestEtcHostsAsKubeletWritesIt(t *testing.T) {
	node := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(node, []byte("127.0.0.1 localhost\n10.0.0.5 board\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := nodeHostsFile
	nodeHostsFile = node
	t.Cleanup(func() { nodeHostsFile = old })
	aliases := []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}}
	cfg := PodConfig{ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local"}
	for _, tc := range []struct {
		name    string
		hostNet bool
		want    string
	}{
		{"pod network", false, "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.42.0.7\tweb\n" +
			"\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"},
		{"host network", true, "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n10.0.0.5 board\n" +
			"\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"},
	} {
		dir := t.TempDir()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: corev1.PodSpec{HostNetwork: tc.hostNet, HostAliases: aliases}}
		if err := writeEtcFiles(dir, pod, cfg, "10.42.0.7"); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "etc-hosts"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("%s: /etc/hosts =\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}

// The etc files are written again only when they change: an agent that
// starts again leaves the files (and their inodes, which running
// containers have bind-mounted) as they are.
func TestEtcFilesRewrittenOnlyWhenChanged(t *testing.T) {
	dir := t.TempDir()
	cfg := PodConfig{ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}}
	if err := writeEtcFiles(dir, pod, cfg, "10.42.0.7"); err != nil {
		t.Fatal(err)
	}
	stat := func(name string) os.FileInfo {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	names := []string{"etc-hosts", "etc-hostname", "resolv.conf"}
	before := map[string]os.FileInfo{}
	for _, n := range names {
		before[n] = stat(n)
	}
	if err := writeEtcFiles(dir, pod, cfg, "10.42.0.7"); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !os.SameFile(before[n], stat(n)) {
			t.Errorf("%s was replaced with the same content", n)
		}
	}
	if err := writeEtcFiles(dir, pod, cfg, "10.42.0.8"); err != nil {
		t.Fatal(err)
	}
	if os.SameFile(before["etc-hosts"], stat("etc-hosts")) {
		t.Error("etc-hosts was not replaced when the pod's address changed")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "etc-hosts")); !strings.Contains(string(got), "10.42.0.8\tweb\n") {
		t.Errorf("etc-hosts after the address changed:\n%s", got)
	}
	if !os.SameFile(before["resolv.conf"], stat("resolv.conf")) {
		t.Error("resolv.conf was replaced though it did not change")
	}
}
