package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenDamagedDataPagesRefused damages a real store's data pages, not
// its meta pages, the way a torn write on an SD card would; the open-time
// consistency check must refuse the file without panicking or changing it.
func TestOpenDamagedDataPagesRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{})
	must(t, err)
	for i := range 200 {
		must(t, s.Pods().Put(SourceAPI, pod("default", fmt.Sprintf("p%03d", i), strings.Repeat("x", 200))))
	}
	s.Close()
	data, err := os.ReadFile(path)
	must(t, err)
	pageSize := os.Getpagesize()
	damaged := 0
	for off := 2 * pageSize; off+pageSize <= len(data); off += 3 * pageSize {
		for i := off; i < off+64; i++ {
			data[i] = 0xff
		}
		damaged++
	}
	if damaged == 0 {
		t.Fatal("store too small to damage")
	}
	must(t, os.WriteFile(path, data, 0o600))
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v, want ErrCorrupt", err)
	}
	t.Log(err)
	after, _ := os.ReadFile(path)
	if string(after) != string(data) {
		t.Fatal("damaged file was changed by the refused open")
	}
}
