package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/outpost-edge/outpost/internal/clock"
)

const (
	dataDirName    = "..data"
	dataDirTmpName = "..data_tmp"
	// tsFormat names the timestamped directories; os.MkdirTemp appends a
	// random suffix.
	tsFormat = "..2006_01_02_15_04_05."

	maxFileNameLength = 255
	maxPathLength     = 4096
)

// cleanPath checks a content volume path as kubelet's AtomicWriter does
// (relative, no "..", not starting with "..", bounded lengths) and returns
// it cleaned.
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("must not be empty")
	}
	if path.IsAbs(p) {
		return "", errors.New("must be a relative path")
	}
	if len(p) > maxPathLength {
		return "", fmt.Errorf("must be at most %d characters", maxPathLength)
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("must not contain NUL")
	}
	items := strings.Split(p, "/")
	for _, it := range items {
		if it == ".." {
			return "", errors.New(`must not contain ".."`)
		}
		if len(it) > maxFileNameLength {
			return "", fmt.Errorf("file names must be at most %d characters", maxFileNameLength)
		}
	}
	if strings.HasPrefix(items[0], "..") {
		return "", errors.New(`must not start with ".."`)
	}
	c := path.Clean(p)
	if c == "." || strings.HasPrefix(c, "..") {
		return "", errors.New("must name a file")
	}
	return c, nil
}

// checkConflicts reports a path that is also a directory of another path.
func checkConflicts(files map[string]file) error {
	for p := range files {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := files[d]; ok {
				return fmt.Errorf("path %q conflicts with %q", p, d)
			}
		}
	}
	return nil
}

// atomicWriter writes a content volume like kubelet's AtomicWriter: the
// files go into a new timestamped directory, the "..data" symlink is
// swapped to it with a rename, and each top-level name is a symlink into
// "..data/".
type atomicWriter struct {
	dir   string
	clock clock.Clock
	gid   int // fsGroup, -1 for none
}

// write makes the volume hold exactly files and reports whether it wrote
// a new version.
func (w atomicWriter) write(files map[string]file) (bool, error) {
	for p := range files {
		if c, err := cleanPath(p); err != nil || c != p {
			return false, fmt.Errorf("path %q: invalid", p)
		}
	}
	if err := checkConflicts(files); err != nil {
		return false, err
	}
	if w.gid >= 0 {
		// kubelet's SetVolumeOwnership for read-only volumes: group read.
		for p, f := range files {
			f.mode |= 0o440
			files[p] = f
		}
	}
	current := w.currentDataDir()
	changed := true
	if current != "" {
		same, err := w.sameContent(filepath.Join(w.dir, current), files)
		if err != nil {
			return false, err
		}
		changed = !same
	}
	if changed {
		name, err := w.writeDataDir(files)
		if err != nil {
			return false, err
		}
		if err := w.swapData(name); err != nil {
			_ = os.RemoveAll(filepath.Join(w.dir, name))
			return false, err
		}
		current = name
	}
	if err := w.linkVisible(files); err != nil {
		return changed, err
	}
	return changed, w.removeStale(current, files)
}

// currentDataDir returns the directory "..data" points to, "" when there is
// none usable.
func (w atomicWriter) currentDataDir() string {
	target, err := os.Readlink(filepath.Join(w.dir, dataDirName))
	if err != nil || !isTimestampDir(target) {
		return ""
	}
	fi, err := os.Lstat(filepath.Join(w.dir, target))
	if err != nil || !fi.IsDir() {
		return ""
	}
	return target
}

// isTimestampDir reports whether name looks like a directory writeDataDir
// made: "..", then a digit, and no slash.
func isTimestampDir(name string) bool {
	return len(name) > 2 && strings.HasPrefix(name, "..") && name[2] >= '0' && name[2] <= '9' && !strings.Contains(name, "/")
}

// sameContent reports whether dir holds exactly files, with the same
// bytes, modes and (with an fsGroup) group.
func (w atomicWriter) sameContent(dir string, files map[string]file) (bool, error) {
	n := 0
	same := true
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		want, ok := files[filepath.ToSlash(rel)]
		if !ok || !d.Type().IsRegular() {
			same = false
			return filepath.SkipAll
		}
		n++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm() != want.mode || (w.gid >= 0 && fileGID(fi) != w.gid) || (want.owner != nil && fileUID(fi) != *want.owner) {
			same = false
			return filepath.SkipAll
		}
		got, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want.data) {
			same = false
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("compare %s: %w", dir, err)
	}
	return same && n == len(files), nil
}

// writeDataDir writes files into a new timestamped directory and returns
// its name.
func (w atomicWriter) writeDataDir(files map[string]file) (string, error) {
	tsDir, err := os.MkdirTemp(w.dir, w.clock.Now().UTC().Format(tsFormat))
	if err != nil {
		return "", err
	}
	name := filepath.Base(tsDir)
	fail := func(err error) (string, error) {
		_ = os.RemoveAll(tsDir)
		return "", err
	}
	dirMode := fs.FileMode(0o755)
	if w.gid >= 0 {
		dirMode |= fs.ModeSetgid
	}
	if err := w.own(tsDir, dirMode); err != nil {
		return fail(err)
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		f := files[p]
		full := filepath.Join(tsDir, filepath.FromSlash(p))
		if err := w.mkdirs(tsDir, filepath.Dir(full), dirMode); err != nil {
			return fail(err)
		}
		if err := w.writeFile(full, f); err != nil {
			return fail(err)
		}
	}
	return name, nil
}

// mkdirs makes dir and its missing parents below root.
func (w atomicWriter) mkdirs(root, dir string, mode fs.FileMode) error {
	if dir == root {
		return nil
	}
	if fi, err := os.Lstat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := w.mkdirs(root, filepath.Dir(dir), mode); err != nil {
		return err
	}
	if err := os.Mkdir(dir, mode); err != nil {
		return err
	}
	return w.own(dir, mode)
}

func (w atomicWriter) writeFile(p string, f file) error {
	fd, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = fd.Write(f.data)
	if err == nil && (w.gid >= 0 || f.owner != nil) {
		uid := -1
		if f.owner != nil {
			uid = int(*f.owner)
		}
		err = fd.Chown(uid, w.gid)
	}
	if err == nil {
		err = fd.Chmod(f.mode)
	}
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	return err
}

// own sets the mode (escaping the umask) and, with an fsGroup, the group.
func (w atomicWriter) own(p string, mode fs.FileMode) error {
	if w.gid >= 0 {
		if err := os.Lchown(p, -1, w.gid); err != nil {
			return err
		}
	}
	return os.Chmod(p, mode)
}

// swapData points "..data" at name atomically.
func (w atomicWriter) swapData(name string) error {
	tmp := filepath.Join(w.dir, dataDirTmpName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Symlink(name, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(w.dir, dataDirName))
}

// topNames returns the first path element of each file.
func topNames(files map[string]file) map[string]bool {
	tops := make(map[string]bool, len(files))
	for p := range files {
		top, _, _ := strings.Cut(p, "/")
		tops[top] = true
	}
	return tops
}

// linkVisible makes each top-level name a symlink into "..data/".
func (w atomicWriter) linkVisible(files map[string]file) error {
	for top := range topNames(files) {
		link := filepath.Join(w.dir, top)
		want := dataDirName + "/" + top
		fi, err := os.Lstat(link)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink == 0:
			return fmt.Errorf("%s exists and is not a symlink into %s", link, dataDirName)
		default:
			if target, err := os.Readlink(link); err == nil && target == want {
				continue
			}
			if err := os.Remove(link); err != nil {
				return err
			}
		}
		if err := os.Symlink(want, link); err != nil {
			return err
		}
	}
	return nil
}

// removeStale removes user-visible symlinks no longer in files, older
// timestamped directories and a leftover "..data_tmp".
func (w atomicWriter) removeStale(current string, files map[string]file) error {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return err
	}
	tops := topNames(files)
	var errs []error
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(w.dir, name)
		switch {
		case name == dataDirName || name == current:
		case name == dataDirTmpName:
			errs = append(errs, os.Remove(p))
		case isTimestampDir(name) && e.IsDir():
			errs = append(errs, os.RemoveAll(p))
		case !tops[name] && e.Type()&fs.ModeSymlink != 0:
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dataDirName+"/") {
				errs = append(errs, os.Remove(p))
			}
		}
	}
	return errors.Join(errs...)
}

// fileUID returns the user owning fi's file, -1 when unknown.
func fileUID(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Uid)
	}
	return -1
}

// fileGID returns the group owning fi's file, -1 when unknown.
func fileGID(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}
