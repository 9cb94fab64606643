package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// setupEmptyDir makes the directory (mode 0777, or the volume's mode) and,
// for medium Memory, mounts a tmpfs on it. Modes and ownership are set only
// when the directory or tmpfs is new, so a container's own changes stay.
func (m *Manager) setupEmptyDir(dir string, pod *corev1.Pod, v *corev1.Volume, info PodInfo, gid int) (Volume, error) {
	ed := v.EmptyDir
	switch ed.Medium {
	case corev1.StorageMediumDefault, corev1.StorageMediumMemory:
	default:
		return Volume{}, volErr(pod, v.Name, "emptyDir medium %q is not supported", ed.Medium)
	}
	perm := fs.FileMode(0o777)
	if ed.Mode != nil {
		if *ed.Mode < 0 || *ed.Mode > 0o1777 {
			return Volume{}, volErr(pod, v.Name, "emptyDir.mode: %#o is not between 0 and 01777", *ed.Mode)
		}
		perm = fileMode(*ed.Mode)
	} else if ed.Medium == corev1.StorageMediumMemory {
		// As kubelet: a tmpfs keeps its root's mode, 1777 (sticky).
		perm |= fs.ModeSticky
	}
	_, err := os.Lstat(dir)
	fresh := errors.Is(err, fs.ErrNotExist)
	if err != nil && !fresh {
		return Volume{}, volErr(pod, v.Name, "%w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return Volume{}, volErr(pod, v.Name, "%w", err)
	}
	if ed.Medium == corev1.StorageMediumMemory {
		var opts string
		if size := memorySize(pod, ed, info); size > 0 {
			opts = fmt.Sprintf("size=%d", size)
		}
		mounted, err := mountTmpfs(dir, 0, opts)
		if err != nil {
			return Volume{}, volErr(pod, v.Name, "%w", err)
		}
		fresh = fresh || mounted
		if mounted {
			m.deps.Log.Info("tmpfs mounted", "pod", podName(pod), "volume", v.Name, "options", opts)
		}
	}
	if fresh {
		if gid >= 0 {
			// kubelet's SetVolumeOwnership: group rwx and setgid on directories.
			perm |= 0o770 | fs.ModeSetgid
			if err := os.Lchown(dir, -1, gid); err != nil {
				return Volume{}, volErr(pod, v.Name, "fsGroup: %w", err)
			}
		}
		if err := os.Chmod(dir, perm); err != nil {
			return Volume{}, volErr(pod, v.Name, "%w", err)
		}
	}
	return Volume{Path: dir, Kind: KindEmptyDir}, nil
}

// memorySize returns the size of a memory-backed emptyDir in bytes, 0 for
// the kernel's default: like kubelet, the smallest of its sizeLimit, the
// pod's memory limit and the node's allocatable memory that is set.
func memorySize(pod *corev1.Pod, ed *corev1.EmptyDirVolumeSource, info PodInfo) int64 {
	var size int64
	take := func(q *resource.Quantity) {
		if q == nil {
			return
		}
		if v := q.Value(); v > 0 && (size == 0 || v < size) {
			size = v
		}
	}
	take(ed.SizeLimit)
	if a, ok := info.NodeAllocatable[corev1.ResourceMemory]; ok {
		take(&a)
	}
	take(podMemoryLimit(pod))
	return size
}

// podMemoryLimit returns the pod's memory limit: the pod-level limit, or
// the sum of its containers' and sidecars' limits or the largest other
// init container limit if larger, when every container has one.
func podMemoryLimit(pod *corev1.Pod) *resource.Quantity {
	if r := pod.Spec.Resources; r != nil {
		if l, ok := r.Limits[corev1.ResourceMemory]; ok {
			return &l
		}
	}
	var sum resource.Quantity
	for _, c := range pod.Spec.Containers {
		l, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			return nil
		}
		sum.Add(l)
	}
	for _, c := range pod.Spec.InitContainers {
		l, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			return nil
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum.Add(l) // a sidecar runs beside the containers
		} else if l.Cmp(sum) > 0 {
			sum = l
		}
	}
	return &sum
}

// fileMode converts an API mode (permission bits, and sticky for emptyDir)
// to a FileMode.
func fileMode(m int32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}
