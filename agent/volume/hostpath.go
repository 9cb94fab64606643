package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// setupHostPath checks (or creates) the host path as kubelet's hostPath
// plugin does for the volume's type.
func setupHostPath(pod *corev1.Pod, v *corev1.Volume) (Volume, error) {
	p := v.HostPath.Path
	var typ corev1.HostPathType
	if v.HostPath.Type != nil {
		typ = *v.HostPath.Type
	}
	fail := func(format string, args ...any) (Volume, error) {
		return Volume{}, volErr(pod, v.Name, "hostPath %q (type %q): "+format, append([]any{p, typ}, args...)...)
	}
	if !filepath.IsAbs(p) {
		return fail("path must be absolute")
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return fail(`path must not contain ".."`)
	}
	p = filepath.Clean(p)

	fi, err := os.Stat(p)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("%w", err)
	}
	switch typ {
	case corev1.HostPathUnset:
	case corev1.HostPathDirectoryOrCreate:
		if !exists {
			if err := mkdirAllMode(p, 0o755); err != nil {
				return fail("create directory: %w", err)
			}
			if fi, err = os.Stat(p); err != nil {
				return fail("%w", err)
			}
		}
		if !fi.IsDir() {
			return fail("is not a directory")
		}
	case corev1.HostPathFileOrCreate:
		if !exists {
			parent := filepath.Dir(p)
			if pfi, err := os.Stat(parent); err != nil || !pfi.IsDir() {
				return fail("parent directory %q does not exist", parent)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err == nil {
				err = f.Chmod(0o644) // whatever the umask
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil && !errors.Is(err, fs.ErrExist) {
				return fail("create file: %w", err)
			}
			if fi, err = os.Stat(p); err != nil {
				return fail("%w", err)
			}
		}
		if !fi.Mode().IsRegular() {
			return fail("is not a file")
		}
	case corev1.HostPathDirectory, corev1.HostPathFile, corev1.HostPathSocket, corev1.HostPathCharDev, corev1.HostPathBlockDev:
		if !exists {
			return fail("does not exist")
		}
		var ok bool
		var what string
		switch typ {
		case corev1.HostPathDirectory:
			ok, what = fi.IsDir(), "a directory"
		case corev1.HostPathFile:
			ok, what = fi.Mode().IsRegular(), "a file"
		case corev1.HostPathSocket:
			ok, what = fi.Mode()&fs.ModeSocket != 0, "a socket"
		case corev1.HostPathCharDev:
			ok, what = fi.Mode()&fs.ModeCharDevice != 0, "a character device"
		case corev1.HostPathBlockDev:
			ok, what = fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0, "a block device"
		}
		if !ok {
			return fail("is not %s", what)
		}
	default:
		return fail("unknown hostPath type")
	}
	return Volume{Path: p, Kind: KindHostPath}, nil
}

// mkdirAllMode is os.MkdirAll giving each directory it creates exactly
// mode, whatever the umask.
func mkdirAllMode(p string, mode fs.FileMode) error {
	if fi, err := os.Stat(p); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", p)
		}
		return nil
	}
	if parent := filepath.Dir(p); parent != p {
		if err := mkdirAllMode(parent, mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	return os.Chmod(p, mode)
}
