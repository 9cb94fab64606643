package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// containerID names attempt n of a container of a pod. IDs are
// deterministic, so an agent killed between create and start finds its
// container again instead of making a second one; the first 12 characters
// of the pod UID lead, so an exit event maps to its pod without a lookup.
func containerID(podUID, name string, attempt int) string {
	id := fmt.Sprintf("%s-%s-%d", uidPrefix(podUID), name, attempt)
	if len(id) > 76 { // containerd's identifier limit
		h := sha256.Sum256([]byte(name))
		id = fmt.Sprintf("%s-%s-%d", uidPrefix(podUID), hex.EncodeToString(h[:8]), attempt)
	}
	return id
}

func uidPrefix(uid string) string {
	u := strings.ReplaceAll(uid, "-", "")
	if len(u) > 12 {
		u = u[:12]
	}
	return u
}

// processArgs merges a container's command and args with its image's
// entrypoint and cmd, as the Kubernetes API defines it.
func processArgs(c *corev1.Container, img Image) []string {
	switch {
	case len(c.Command) > 0:
		return append(append([]string(nil), c.Command...), c.Args...)
	case len(c.Args) > 0:
		return append(append([]string(nil), img.Entrypoint...), c.Args...)
	default:
		return append(append([]string(nil), img.Entrypoint...), img.Cmd...)
	}
}

// QoSClass computes a pod's QoS class from its containers' requests and
// limits of cpu and memory.
func QoSClass(p *corev1.Pod) corev1.PodQOSClass {
	any, guaranteed := false, true
	for _, c := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if hasReq && !req.IsZero() || hasLim && !lim.IsZero() {
				any = true
			}
			if !hasLim || lim.IsZero() || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !any:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// resources maps a container's requests and limits to cgroup settings, as
// kubelet does: shares from the cpu request (limit when no request), CFS
// quota from the cpu limit over a 100 ms period, memory limit in bytes, and
// oom_score_adj from the QoS class.
func resources(p *corev1.Pod, c *corev1.Container, qos corev1.PodQOSClass, memCapacity int64) Resources {
	const period = 100000
	var r Resources
	cpuReq := c.Resources.Requests[corev1.ResourceCPU]
	cpuLim := c.Resources.Limits[corev1.ResourceCPU]
	if cpuReq.IsZero() && !cpuLim.IsZero() {
		cpuReq = cpuLim
	}
	shares := uint64(cpuReq.MilliValue()) * 1024 / 1000
	if shares < 2 {
		shares = 2
	}
	r.CPUShares = shares
	if !cpuLim.IsZero() {
		r.CPUQuota = max(cpuLim.MilliValue()*period/1000, 1000)
		r.CPUPeriod = period
	}
	if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		r.MemoryLimit = m.Value()
	}
	switch qos {
	case corev1.PodQOSGuaranteed:
		r.OOMScoreAdj = -997
	case corev1.PodQOSBestEffort:
		r.OOMScoreAdj = 1000
	default:
		memReq := c.Resources.Requests[corev1.ResourceMemory]
		adj := 1000
		if memCapacity > 0 {
			adj = 1000 - int(1000*memReq.Value()/memCapacity)
		}
		r.OOMScoreAdj = min(max(adj, 2), 999)
	}
	return r
}

// security maps a container's securityContext, falling back to the pod's.
func security(p *corev1.Pod, c *corev1.Container) Security {
	var s Security
	psc := p.Spec.SecurityContext
	if psc != nil {
		s.UID, s.GID = psc.RunAsUser, psc.RunAsGroup
		s.SupplementalGID = psc.SupplementalGroups
		if psc.FSGroup != nil {
			s.SupplementalGID = append(s.SupplementalGID, *psc.FSGroup)
		}
	}
	s.Sysctls = podSysctls(p)
	sc := c.SecurityContext
	if sc == nil {
		return s
	}
	if sc.RunAsUser != nil {
		s.UID = sc.RunAsUser
	}
	if sc.RunAsGroup != nil {
		s.GID = sc.RunAsGroup
	}
	s.Privileged = sc.Privileged != nil && *sc.Privileged
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Add {
			s.CapAdd = append(s.CapAdd, string(c))
		}
		for _, c := range sc.Capabilities.Drop {
			s.CapDrop = append(s.CapDrop, string(c))
		}
	}
	s.ReadOnlyRootfs = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	s.NoNewPrivileges = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	return s
}

// runAsNonRoot reports whether the pod or container asks for a non-root
// user.
func runAsNonRoot(p *corev1.Pod, c *corev1.Container) bool {
	if c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil {
		return *c.SecurityContext.RunAsNonRoot
	}
	return p.Spec.SecurityContext != nil && p.Spec.SecurityContext.RunAsNonRoot != nil && *p.Spec.SecurityContext.RunAsNonRoot
}

// checkNonRoot fails when runAsNonRoot is set and the container would run
// as root, as kubelet does.
func checkNonRoot(p *corev1.Pod, c *corev1.Container, sec Security, img Image) error {
	if !runAsNonRoot(p, c) {
		return nil
	}
	if sec.UID != nil {
		if *sec.UID == 0 {
			return fmt.Errorf("container's runAsUser breaks non-root policy (pod: %q, container: %s)", p.Namespace+"/"+p.Name, c.Name)
		}
		return nil
	}
	user, _, _ := strings.Cut(img.User, ":")
	if user == "" || user == "0" || user == "root" {
		return fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", p.Namespace+"/"+p.Name, c.Name)
	}
	var n int
	if _, err := fmt.Sscanf(user, "%d", &n); err != nil {
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", user, p.Namespace+"/"+p.Name, c.Name)
	}
	return nil
}
