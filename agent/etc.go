package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// podHostname is the pod's hostname as kubelet makes it:
// spec.hostnameOverride, else spec.hostname, else the pod's name, cut to
// 63 characters (what sethostname takes) without a trailing '-' or '.'.
func podHostname(pod *corev1.Pod) string {
	h := pod.Name
	if pod.Spec.Hostname != "" {
		h = pod.Spec.Hostname
	}
	if o := pod.Spec.HostnameOverride; o != nil && *o != "" {
		h = *o
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// nodeHostsFile is the node's hosts file, the base of a host-network pod's.
var nodeHostsFile = "/etc/hosts"

// writeEtcFiles writes the pod's /etc/hosts, /etc/hostname and
// /etc/resolv.conf into its directory, as kubelet does.
func writeEtcFiles(dir string, pod *corev1.Pod, cfg PodConfig, podIP string) error {
	hostname := podHostname(pod)
	var hosts strings.Builder
	if pod.Spec.HostNetwork {
		// kubelet's: the node's own file, marked, with the aliases.
		node, err := os.ReadFile(nodeHostsFile)
		if err != nil {
			return fmt.Errorf("read the node's hosts file: %w", err)
		}
		hosts.WriteString("# Kubernetes-managed hosts file (host network).\n")
		hosts.Write(node)
	} else {
		// kubelet's header and lines, byte for byte: clients (and
		// NodeConformance) recognize a managed file by its first line.
		hosts.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
		fqdn := hostname
		// An override is the whole name: kubelet gives such a pod no domain.
		if pod.Spec.Subdomain != "" && pod.Spec.HostnameOverride == nil {
			fqdn = fmt.Sprintf("%s.%s.%s.svc.%s", hostname, pod.Spec.Subdomain, pod.Namespace, cfg.ClusterDomain)
		}
		if podIP != "" {
			if fqdn != hostname {
				fmt.Fprintf(&hosts, "%s\t%s\t%s\n", podIP, fqdn, hostname)
			} else {
				fmt.Fprintf(&hosts, "%s\t%s\n", podIP, hostname)
			}
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		hosts.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&hosts, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	resolv, err := resolvConf(pod, cfg)
	if err != nil {
		return err
	}
	for name, data := range map[string]string{"etc-hosts": hosts.String(), "etc-hostname": hostname + "\n", "resolv.conf": resolv} {
		if err := writeIfChanged(filepath.Join(dir, name), []byte(data)); err != nil {
			return err
		}
	}
	return nil
}

// writeIfChanged writes data to path (writeAtomic) unless path holds it
// already, as it does when the agent starts again, after a reboot or
// not: the file and its inode stay, so a running container's bind mount
// of it still shows the file, and a board's SD card is spared three
// writes a pod.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return writeAtomic(path, data)
}

func resolvConf(pod *corev1.Pod, cfg PodConfig) (string, error) {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	var servers, searches, options []string
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		servers = []string{cfg.ClusterDNS}
		searches = []string{pod.Namespace + ".svc." + cfg.ClusterDomain, "svc." + cfg.ClusterDomain, cfg.ClusterDomain}
		options = []string{"ndots:5"}
	case corev1.DNSDefault:
		host, err := os.ReadFile("/etc/resolv.conf")
		if err == nil {
			for _, line := range strings.Split(string(host), "\n") {
				f := strings.Fields(line)
				if len(f) < 2 {
					continue
				}
				switch f[0] {
				case "nameserver":
					servers = append(servers, f[1])
				case "search", "domain":
					searches = append(searches, f[1:]...)
				case "options":
					options = append(options, f[1:]...)
				}
			}
		}
	}
	if dc := pod.Spec.DNSConfig; dc != nil {
		servers = append(servers, dc.Nameservers...)
		searches = append(searches, dc.Searches...)
		for _, o := range dc.Options {
			if o.Value != nil {
				options = append(options, o.Name+":"+*o.Value)
			} else {
				options = append(options, o.Name)
			}
		}
	}
	var b strings.Builder
	for _, s := range servers {
		if s != "" {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
	}
	if len(searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(searches, " "))
	}
	if len(options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(options, " "))
	}
	return b.String(), nil
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
