package volume

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const mountInfoPath = "/proc/self/mountinfo"

// mountPoints returns the mount points listed in r (in /proc/self/mountinfo
// format) that are dir or below it.
func mountPoints(r io.Reader, dir string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(string(fields[4]))
		if mp == dir || strings.HasPrefix(mp, dir+"/") || dir == "/" {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMountPath undoes the kernel's octal escaping of space, tab,
// newline and backslash in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func readMountPoints(dir string) ([]string, error) {
	f, err := os.Open(mountInfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mountPoints(f, dir)
}

// isMountPoint reports whether dir is a mount point.
func isMountPoint(dir string) (bool, error) {
	// mountinfo lists paths without symlinks.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, err
	}
	mps, err := readMountPoints(dir)
	if err != nil {
		return false, err
	}
	return slices.Contains(mps, dir), nil
}

// unmountBelow unmounts everything mounted at dir (a path without
// symlinks) or below it, deepest first, and fails if anything remains.
func unmountBelow(dir string) error {
	mps, err := readMountPoints(dir)
	if err != nil {
		return err
	}
	// Deepest first; a path mounted twice is unmounted twice.
	slices.SortStableFunc(mps, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range mps {
		if err := unix.Unmount(mp, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left, err := readMountPoints(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("still mounted: %s", strings.Join(left, ", "))
	}
	return nil
}

// mountTmpfs mounts a tmpfs on dir unless one is mounted there already,
// and reports whether it mounted one.
func mountTmpfs(dir string, flags uintptr, data string) (bool, error) {
	mounted, err := isMountPoint(dir)
	if err != nil || mounted {
		return false, err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, data); err != nil {
		return false, fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return true, nil
}
