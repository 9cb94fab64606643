package podenv

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldRefValue returns the value of a downward API field reference to pod,
// as kubelet formats it: metadata.name, metadata.namespace, metadata.uid,
// metadata.labels and metadata.annotations (all of them as sorted
// key="value" lines, or one with ['key']), spec.nodeName,
// spec.serviceAccountName, status.podIP(s) and status.hostIP(s). podIP and
// hostIP answer the status fields; when empty, the pod's status does.
func FieldRefValue(pod *corev1.Pod, fs *corev1.ObjectFieldSelector, podIP, hostIP string) (string, error) {
	if fs.APIVersion != "" && fs.APIVersion != "v1" {
		return "", fmt.Errorf("fieldRef %q: unsupported apiVersion %q", fs.FieldPath, fs.APIVersion)
	}
	if path, key, ok := SplitSubscript(fs.FieldPath); ok {
		switch path {
		case "metadata.annotations":
			if errs := validation.IsQualifiedName(strings.ToLower(key)); len(errs) != 0 {
				return "", fmt.Errorf("fieldRef %q: invalid key: %s", fs.FieldPath, strings.Join(errs, "; "))
			}
			return pod.Annotations[key], nil
		case "metadata.labels":
			if errs := validation.IsQualifiedName(key); len(errs) != 0 {
				return "", fmt.Errorf("fieldRef %q: invalid key: %s", fs.FieldPath, strings.Join(errs, "; "))
			}
			return pod.Labels[key], nil
		}
		return "", fmt.Errorf("fieldRef %q: %s takes no subscript", fs.FieldPath, path)
	}
	switch fs.FieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return FormatMap(pod.Labels), nil
	case "metadata.annotations":
		return FormatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return firstIP(podIPs(pod, podIP)), nil
	case "status.podIPs":
		return strings.Join(podIPs(pod, podIP), ","), nil
	case "status.hostIP":
		return firstIP(hostIPs(pod, hostIP)), nil
	case "status.hostIPs":
		return strings.Join(hostIPs(pod, hostIP), ","), nil
	}
	return "", fmt.Errorf("fieldRef %q: unsupported field path", fs.FieldPath)
}

// SplitSubscript splits "path['key']" into path and key; ok is false for a
// path without a subscript.
func SplitSubscript(fieldPath string) (path, key string, ok bool) {
	s, found := strings.CutSuffix(fieldPath, "']")
	if !found {
		return fieldPath, "", false
	}
	path, key, found = strings.Cut(s, "['")
	if !found || path == "" {
		return fieldPath, "", false
	}
	return path, key, true
}

// FormatMap formats labels or annotations as kubelet does: key="value"
// lines (Go-quoted values) sorted by key, without a final newline.
func FormatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
	}
	return b.String()
}

func podIPs(pod *corev1.Pod, ip string) []string {
	if ip != "" {
		return []string{ip}
	}
	var ips []string
	for _, p := range pod.Status.PodIPs {
		ips = append(ips, p.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []string{pod.Status.PodIP}
	}
	return ips
}

func hostIPs(pod *corev1.Pod, ip string) []string {
	if ip != "" {
		return []string{ip}
	}
	var ips []string
	for _, h := range pod.Status.HostIPs {
		ips = append(ips, h.IP)
	}
	if len(ips) == 0 && pod.Status.HostIP != "" {
		ips = []string{pod.Status.HostIP}
	}
	return ips
}

func firstIP(ips []string) string {
	if len(ips) == 0 {
		return ""
	}
	return ips[0]
}

// ResourceFieldRefValue returns the value of a downward API resource
// reference as kubelet computes it: the resource of the container named by
// fs.ContainerName (or of c when that is empty) divided by fs.Divisor
// (default 1) and rounded up. Supported resources are limits.* and
// requests.* of cpu, memory, ephemeral-storage and hugepages-<size>. A
// limit the container does not set falls back to the pod-level limit (cpu,
// memory), then to allocatable (cpu, memory, ephemeral-storage); an unset
// request takes the container's limit, as API defaulting would.
func ResourceFieldRefValue(pod *corev1.Pod, c *corev1.Container, fs *corev1.ResourceFieldSelector, allocatable corev1.ResourceList) (string, error) {
	target := c
	if fs.ContainerName != "" {
		target = findContainer(pod, fs.ContainerName)
		if target == nil {
			return "", fmt.Errorf("resourceFieldRef %q: container %q not found in pod", fs.Resource, fs.ContainerName)
		}
	}
	if target == nil {
		return "", fmt.Errorf("resourceFieldRef %q: containerName is required", fs.Resource)
	}
	which, name, _ := strings.Cut(fs.Resource, ".")
	rn := corev1.ResourceName(name)
	switch {
	case which != "limits" && which != "requests",
		rn != corev1.ResourceCPU && rn != corev1.ResourceMemory && rn != corev1.ResourceEphemeralStorage &&
			!strings.HasPrefix(name, corev1.ResourceHugePagesPrefix):
		return "", fmt.Errorf("resourceFieldRef %q: unsupported resource", fs.Resource)
	}
	divisor := fs.Divisor
	if divisor.IsZero() {
		divisor = *resource.NewQuantity(1, resource.DecimalSI)
	}
	if divisor.Sign() < 0 {
		return "", fmt.Errorf("resourceFieldRef %q: divisor %s must be positive", fs.Resource, divisor.String())
	}
	q := containerLimit(pod, target, rn, allocatable)
	if which == "requests" {
		if r, ok := target.Resources.Requests[rn]; ok {
			q = r
		} else if l, ok := target.Resources.Limits[rn]; ok {
			q = l
		} else {
			q = resource.Quantity{}
		}
	}
	var v, d int64
	if rn == corev1.ResourceCPU {
		v, d = q.MilliValue(), divisor.MilliValue()
	} else {
		v, d = q.Value(), divisor.Value()
	}
	if d <= 0 {
		return "", fmt.Errorf("resourceFieldRef %q: divisor %s is too small", fs.Resource, divisor.String())
	}
	return strconv.FormatInt(ceilDiv(v, d), 10), nil
}

// containerLimit returns c's limit of rn, defaulted like kubelet's
// defaultPodLimitsForDownwardAPI.
func containerLimit(pod *corev1.Pod, c *corev1.Container, rn corev1.ResourceName, allocatable corev1.ResourceList) resource.Quantity {
	if l, ok := c.Resources.Limits[rn]; ok && !l.IsZero() {
		return l
	}
	switch rn {
	case corev1.ResourceCPU, corev1.ResourceMemory:
		if pod.Spec.Resources != nil {
			if l, ok := pod.Spec.Resources.Limits[rn]; ok && !l.IsZero() {
				return l
			}
		}
		fallthrough
	case corev1.ResourceEphemeralStorage:
		if a, ok := allocatable[rn]; ok {
			return a
		}
	}
	return c.Resources.Limits[rn]
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// ceilDiv returns a/b rounded up, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}
