package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// imagePollInterval is how often the image directory is looked at while
// the agent runs.
const imagePollInterval = 2 * time.Second

// importer imports an image tarball and returns the names of its images;
// the containerd adapter is one. ImportFile records the tarball's version
// with its images, and Imported says whether the images an import of
// that version brought are all still there, as it left them.
type importer interface {
	ImportFile(ctx context.Context, path, version string) ([]string, error)
	Imported(ctx context.Context, file, version string) ([]string, bool)
}

// fileStamp is what a directory listing says of a file: an edit or a copy
// still being written changes it.
type fileStamp struct {
	size  int64
	mtime time.Time
}

// version names the file's version to the importer.
func (s fileStamp) version() string {
	return strconv.FormatInt(s.size, 10) + "@" + strconv.FormatInt(s.mtime.UnixNano(), 10)
}

// imageDir imports the image tarballs (*.tar) of a directory: at start,
// every one whose images are not in containerd as its last import left
// them (an agent or board restart does not copy an unchanged tarball
// into containerd again); then, while the agent runs, each one that
// appears or changes, once it has looked the same on two polls in a row
// (so a tarball still being copied is not imported half-written). A
// tarball is imported once per version: one whose import failed is
// tried again only after it changes.
type imageDir struct {
	dir string
	imp importer
	log *slog.Logger
	// onImport, when set, is called after a poll that imported images.
	onImport func()

	seen map[string]fileStamp // at the last poll
	done map[string]fileStamp // imported (or failed) at this stamp
}

func newImageDir(dir string, imp importer, log *slog.Logger) *imageDir {
	return &imageDir{dir: dir, imp: imp, log: log, seen: map[string]fileStamp{}, done: map[string]fileStamp{}}
}

// importAll imports every tarball in the directory at once, as at start,
// when no copy is expected to be under way.
func (d *imageDir) importAll(ctx context.Context) {
	d.scan(ctx, false)
}

// watch polls the directory every interval until ctx ends.
func (d *imageDir) watch(ctx context.Context, clk clock.Clock, interval time.Duration) {
	tick := clk.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
			d.scan(ctx, true)
		}
	}
}

// scan looks at the directory once and imports what is due; with
// settle, a new or changed tarball only once it is unchanged since the
// previous scan. It reports whether it imported anything.
func (d *imageDir) scan(ctx context.Context, settle bool) bool {
	files, err := d.list()
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) && d.seen != nil {
			d.log.Warn("read image dir", "dir", d.dir, "err", err)
		}
		// Logged once until the directory can be read again.
		d.seen = nil
		return false
	}
	prev := d.seen
	d.seen = files
	imported := false
	for name, st := range files {
		if done, ok := d.done[name]; ok && done == st {
			continue
		}
		if settle {
			if was, ok := prev[name]; !ok || was != st {
				continue // new or still changing: look again next time
			}
		}
		if ctx.Err() != nil {
			return imported
		}
		d.done[name] = st
		if names, ok := d.imp.Imported(ctx, name, st.version()); ok {
			d.log.Debug("image tarball imported before", "file", filepath.Join(d.dir, name), "images", names)
			continue
		}
		names, err := d.imp.ImportFile(ctx, filepath.Join(d.dir, name), st.version())
		if err != nil {
			d.log.Warn("import image tarball; trying again when the file changes", "file", filepath.Join(d.dir, name), "err", err)
			continue
		}
		d.log.Info("imported images", "file", filepath.Join(d.dir, name), "images", names)
		imported = true
	}
	for name := range d.done {
		if _, ok := files[name]; !ok {
			delete(d.done, name) // put back later, it is imported again
		}
	}
	if imported && d.onImport != nil {
		d.onImport()
	}
	return imported
}

// list returns the stamps of the directory's tarballs by name.
func (d *imageDir) list() (map[string]fileStamp, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	out := map[string]fileStamp{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		info, err := os.Stat(filepath.Join(d.dir, e.Name())) // a symlink counts as its target
		if err != nil || !info.Mode().IsRegular() {
			continue // gone since the listing, or not a plain file
		}
		out[e.Name()] = fileStamp{size: info.Size(), mtime: info.ModTime()}
	}
	return out, nil
}
