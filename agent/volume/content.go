package volume

import (
	"context"
	"fmt"
	"io/fs"
	"os"

	"github.com/outpost-edge/outpost/agent/podenv"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// file is one file of a content volume.
type file struct {
	data []byte
	mode fs.FileMode
	// owner is the file's owner UID; nil leaves it to the agent's user.
	// Only service account tokens set it (kubelet's FsUser).
	owner *int64
}

const defaultMode = 0o644

// payload builds the files of a configMap, secret, downwardAPI or projected
// volume. Item paths are checked here, naming the field.
func (m *Manager) payload(ctx context.Context, podDir string, pod *corev1.Pod, v *corev1.Volume, info PodInfo) (map[string]file, error) {
	files := map[string]file{}
	switch {
	case v.ConfigMap != nil:
		s := v.ConfigMap
		mode, err := modeOf(pod, v.Name, "configMap.defaultMode", s.DefaultMode, defaultMode)
		if err != nil {
			return nil, err
		}
		return files, m.configMapFiles(pod, v.Name, "configMap", s.Name, s.Items, mode, isTrue(s.Optional), files)
	case v.Secret != nil:
		s := v.Secret
		mode, err := modeOf(pod, v.Name, "secret.defaultMode", s.DefaultMode, defaultMode)
		if err != nil {
			return nil, err
		}
		return files, m.secretFiles(pod, v.Name, "secret", s.SecretName, s.Items, mode, isTrue(s.Optional), files)
	case v.DownwardAPI != nil:
		s := v.DownwardAPI
		mode, err := modeOf(pod, v.Name, "downwardAPI.defaultMode", s.DefaultMode, defaultMode)
		if err != nil {
			return nil, err
		}
		return files, downwardAPIFiles(pod, v.Name, "downwardAPI", s.Items, mode, info, files)
	case v.Projected != nil:
		s := v.Projected
		mode, err := modeOf(pod, v.Name, "projected.defaultMode", s.DefaultMode, defaultMode)
		if err != nil {
			return nil, err
		}
		for i, src := range s.Sources {
			field := fmt.Sprintf("projected.sources[%d]", i)
			switch {
			case src.ConfigMap != nil:
				err = m.configMapFiles(pod, v.Name, field+".configMap", src.ConfigMap.Name, src.ConfigMap.Items, mode, isTrue(src.ConfigMap.Optional), files)
			case src.Secret != nil:
				err = m.secretFiles(pod, v.Name, field+".secret", src.Secret.Name, src.Secret.Items, mode, isTrue(src.Secret.Optional), files)
			case src.DownwardAPI != nil:
				err = downwardAPIFiles(pod, v.Name, field+".downwardAPI", src.DownwardAPI.Items, mode, info, files)
			case src.ServiceAccountToken != nil:
				err = m.serviceAccountToken(ctx, podDir, pod, v.Name, field, i, src.ServiceAccountToken, mode, files)
			case src.ClusterTrustBundle != nil:
				err = volErr(pod, v.Name, "%s.clusterTrustBundle is not supported", field)
			default:
				err = volErr(pod, v.Name, "%s: unsupported projection", field)
			}
			if err != nil {
				return nil, err
			}
		}
		return files, nil
	}
	return files, nil
}

func isTrue(b *bool) bool { return b != nil && *b }

// modeOf returns the mode m sets, or def when m is nil.
func modeOf(pod *corev1.Pod, vol, field string, m *int32, def fs.FileMode) (fs.FileMode, error) {
	if m == nil {
		return def, nil
	}
	if *m < 0 || *m > 0o777 {
		return 0, volErr(pod, vol, "%s: %#o is not between 0 and 0777", field, *m)
	}
	return fs.FileMode(*m), nil
}

// add puts one file into files after checking its path.
func add(pod *corev1.Pod, vol, field, path string, data []byte, mode fs.FileMode, files map[string]file) error {
	clean, err := cleanPath(path)
	if err != nil {
		return volErr(pod, vol, "%s: path %q: %w", field, path, err)
	}
	files[clean] = file{data: data, mode: mode}
	return nil
}

// keyFiles adds data (all keys, or the items' keys) to files; a missing
// key is a *MissingError unless optional.
func keyFiles(pod *corev1.Pod, vol, field, kind, name string, data map[string][]byte, items []corev1.KeyToPath, mode fs.FileMode, optional bool, files map[string]file) error {
	if len(items) == 0 {
		for k, d := range data {
			if err := add(pod, vol, field, k, d, mode, files); err != nil {
				return err
			}
		}
		return nil
	}
	for i, it := range items {
		itemField := fmt.Sprintf("%s.items[%d]", field, i)
		d, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return &MissingError{Pod: podName(pod), Volume: vol, Kind: kind, Name: name, Key: it.Key}
		}
		m, err := modeOf(pod, vol, itemField+".mode", it.Mode, mode)
		if err != nil {
			return err
		}
		if err := add(pod, vol, itemField, it.Path, d, m, files); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) configMapFiles(pod *corev1.Pod, vol, field, name string, items []corev1.KeyToPath, mode fs.FileMode, optional bool, files map[string]file) error {
	if name == "" {
		return volErr(pod, vol, "%s: name is required", field)
	}
	rec, found, err := m.deps.Store.ConfigMaps().Get(pod.Namespace, name)
	if err != nil {
		return volErr(pod, vol, "get configMap %q: %w", name, err)
	}
	if !found {
		if optional {
			return nil
		}
		return &MissingError{Pod: podName(pod), Volume: vol, Kind: KindConfigMap, Name: name}
	}
	cm := rec.Object
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles(pod, vol, field, KindConfigMap, name, data, items, mode, optional, files)
}

func (m *Manager) secretFiles(pod *corev1.Pod, vol, field, name string, items []corev1.KeyToPath, mode fs.FileMode, optional bool, files map[string]file) error {
	if name == "" {
		return volErr(pod, vol, "%s: secretName is required", field)
	}
	rec, found, err := m.deps.Store.Secrets().Get(pod.Namespace, name)
	if err != nil {
		return volErr(pod, vol, "get secret %q: %w", name, err)
	}
	if !found {
		if optional {
			return nil
		}
		return &MissingError{Pod: podName(pod), Volume: vol, Kind: KindSecret, Name: name}
	}
	return keyFiles(pod, vol, field, KindSecret, name, podenv.SecretData(rec.Object), items, mode, optional, files)
}

func downwardAPIFiles(pod *corev1.Pod, vol, field string, items []corev1.DownwardAPIVolumeFile, mode fs.FileMode, info PodInfo, files map[string]file) error {
	for i, it := range items {
		itemField := fmt.Sprintf("%s.items[%d]", field, i)
		var val string
		var err error
		switch {
		case it.FieldRef != nil:
			val, err = podenv.FieldRefValue(pod, it.FieldRef, info.PodIP, info.HostIP)
		case it.ResourceFieldRef != nil:
			val, err = podenv.ResourceFieldRefValue(pod, nil, it.ResourceFieldRef, info.NodeAllocatable)
		default:
			err = fmt.Errorf("needs fieldRef or resourceFieldRef")
		}
		if err != nil {
			return volErr(pod, vol, "%s: %w", itemField, err)
		}
		m, err := modeOf(pod, vol, itemField+".mode", it.Mode, mode)
		if err != nil {
			return err
		}
		if err := add(pod, vol, itemField, it.Path, []byte(val), m, files); err != nil {
			return err
		}
	}
	return nil
}

// writeContent writes files into the content volume at dir, on a tmpfs
// when asked, and logs when the content changed.
func (m *Manager) writeContent(dir string, pod *corev1.Pod, vol, kind string, files map[string]file, tmpfs bool, gid int) error {
	_, statErr := os.Lstat(dir)
	fresh := statErr != nil
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return volErr(pod, vol, "%w", err)
	}
	if tmpfs {
		mounted, err := mountTmpfs(dir, unix.MS_NOSUID|unix.MS_NODEV, "mode=0755")
		if err != nil {
			return volErr(pod, vol, "%w", err)
		}
		fresh = fresh || mounted
	}
	if fresh {
		mode := fs.FileMode(0o755)
		if gid >= 0 {
			mode |= 0o550 | fs.ModeSetgid
			if err := os.Lchown(dir, -1, gid); err != nil {
				return volErr(pod, vol, "fsGroup: %w", err)
			}
		}
		if err := os.Chmod(dir, mode); err != nil {
			return volErr(pod, vol, "%w", err)
		}
	}
	w := atomicWriter{dir: dir, clock: m.deps.Clock, gid: gid}
	changed, err := w.write(files)
	if err != nil {
		return volErr(pod, vol, "%w", err)
	}
	if changed {
		if fresh {
			m.deps.Log.Debug("volume written", "pod", podName(pod), "volume", vol, "kind", kind, "files", len(files))
		} else {
			m.deps.Log.Info("volume content updated", "pod", podName(pod), "volume", vol, "kind", kind, "files", len(files))
		}
	}
	return nil
}
