package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/outpost-edge/outpost/agent/podenv"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// Mounts turns a container's volumeMounts into OCI bind mounts ("rbind",
// "rprivate", and "ro" when the mount or the volume is read-only), in the
// order the container lists them. A subPath is resolved inside the volume
// (see resolveSubPath); a subPathExpr needs the container's environment,
// so use MountsWithEnv for containers that have one. mountPropagation may
// only be None.
func Mounts(pod *corev1.Pod, c *corev1.Container, vols map[string]Volume) ([]specs.Mount, error) {
	return MountsWithEnv(pod, c, vols, nil)
}

// MountsWithEnv is Mounts for a container whose volumeMounts may use
// subPathExpr; env is the container's environment as podenv.Env returns it
// ("NAME=value"). Like kubelet, a reference to a variable that is unset or
// empty is an error.
func MountsWithEnv(pod *corev1.Pod, c *corev1.Container, vols map[string]Volume, env []string) ([]specs.Mount, error) {
	mounts := make([]specs.Mount, 0, len(c.VolumeMounts))
	var lookup func(string) (string, bool)
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		fail := func(format string, args ...any) ([]specs.Mount, error) {
			return nil, fmt.Errorf("pod %s: container %q: volumeMount %q at %q: "+format,
				append([]any{podName(pod), c.Name, vm.Name, vm.MountPath}, args...)...)
		}
		vol, ok := vols[vm.Name]
		if !ok {
			return fail("no volume %q in the pod", vm.Name)
		}
		dest := filepath.Join("/", vm.MountPath)
		if vm.MountPath == "" || dest == "/" {
			return fail("mountPath must name a directory below /")
		}
		if p := vm.MountPropagation; p != nil && *p != corev1.MountPropagationNone {
			return fail("mountPropagation %s is not supported (only None)", *p)
		}
		if r := vm.RecursiveReadOnly; r != nil && *r == corev1.RecursiveReadOnlyEnabled {
			return fail("recursiveReadOnly Enabled is not supported")
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			if sub != "" {
				return fail("subPath and subPathExpr are mutually exclusive")
			}
			if lookup == nil {
				lookup = podenv.Lookup(env)
			}
			var missing []string
			sub = podenv.Expand(vm.SubPathExpr, func(name string) (string, bool) {
				v, ok := lookup(name)
				if !ok || v == "" {
					missing = append(missing, name)
				}
				return v, true
			})
			if len(missing) > 0 {
				slices.Sort(missing)
				return fail("subPathExpr %q: missing value for %s", vm.SubPathExpr, strings.Join(slices.Compact(missing), ", "))
			}
		}
		src := vol.Path
		if sub != "" {
			p, err := resolveSubPath(vol.Path, sub)
			if err != nil {
				return fail("subPath %q: %w", sub, err)
			}
			src = p
		}
		opts := []string{"rbind", "rprivate"}
		if vm.ReadOnly || vol.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		for _, o := range vm.BindMountOptions {
			switch o {
			case "noexec", "nodev", "nosuid":
				opts = append(opts, o)
			default:
				return fail("bindMountOptions: %q is not one of noexec, nodev, nosuid", o)
			}
		}
		mounts = append(mounts, specs.Mount{
			Destination: dest,
			Type:        "bind",
			Source:      src,
			Options:     opts,
		})
	}
	return mounts, nil
}

// resolveSubPath returns the host path of sub inside the volume at base,
// as kubelet does: sub must be relative without "..", symlinks in it may
// not lead out of the volume, and missing directories are created with the
// volume's mode. The result contains no symlinks.
func resolveSubPath(base, sub string) (string, error) {
	if err := checkSubPath(sub); err != nil {
		return "", err
	}
	root, err := filepath.EvalSymlinks(base)
	if err != nil {
		return "", fmt.Errorf("resolve volume: %w", err)
	}
	rootInfo, err := os.Stat(root)
	if err != nil {
		return "", err
	}
	perm := rootInfo.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSticky)

	cur := root
	parts := strings.Split(filepath.Clean(sub), "/")
	for i, part := range parts {
		if !rootInfo.IsDir() {
			return "", errors.New("volume is not a directory")
		}
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(next, perm); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", err
			}
			if err := os.Chmod(next, perm); err != nil {
				return "", err
			}
			if fi, err = os.Lstat(next); err != nil {
				return "", err
			}
			if !fi.IsDir() {
				return "", fmt.Errorf("%s changed while it was created", next)
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			resolved, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", fmt.Errorf("symlink %s does not resolve: %w", next, err)
			}
			if !within(root, resolved) {
				return "", fmt.Errorf("symlink %s leads out of the volume", next)
			}
			next = resolved
			if fi, err = os.Stat(next); err != nil {
				return "", err
			}
		}
		if i < len(parts)-1 && !fi.IsDir() {
			return "", fmt.Errorf("%s is not a directory", next)
		}
		cur = next
	}
	// Check the result once more through the kernel: the path the opened
	// file really has must be cur, inside the volume.
	f, err := os.OpenFile(cur, os.O_RDONLY|unix.O_PATH, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return "", err
	}
	if real != cur || !within(root, real) {
		return "", fmt.Errorf("%s changed while it was resolved", sub)
	}
	return cur, nil
}

// checkSubPath rejects an absolute subPath or one with a ".." element.
func checkSubPath(sub string) error {
	if filepath.IsAbs(sub) {
		return errors.New("must be a relative path")
	}
	if slices.Contains(strings.Split(sub, "/"), "..") {
		return errors.New(`must not contain ".."`)
	}
	if strings.ContainsRune(sub, 0) {
		return errors.New("must not contain NUL")
	}
	return nil
}

// within reports whether p is root or below it; both are clean absolute
// paths.
func within(root, p string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}
