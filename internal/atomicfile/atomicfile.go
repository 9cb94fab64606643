// Package atomicfile writes files so that a power cut leaves the old
// content or the new, never a part.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data (mode 0600), synced: written to a
// temporary file beside it, then renamed over it.
func Write(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
