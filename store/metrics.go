package store

import (
	"os"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// writeStats counts the store's committed write transactions and the
// bytes they wrote: an SD card wears with every page written, and bbolt
// rewrites whole pages (the changed leaf, branch and bucket pages, then a
// meta page) for every commit however small the change.
type writeStats struct {
	// last is the write transaction whose commit is counted already: the
	// functions of one Batch share a transaction. It is used only inside
	// write transactions, which bbolt runs one at a time.
	last    *bolt.Tx
	commits atomic.Uint64
	bytes   atomic.Uint64
}

// count counts tx's commit, if it commits, once.
func (w *writeStats) count(tx *bolt.Tx) {
	if tx == w.last {
		return
	}
	w.last = tx
	meta := uint64(tx.DB().Info().PageSize)
	tx.OnCommit(func() {
		// Every page a commit allocates is a dirty page it writes; then
		// it writes one meta page.
		st := tx.Stats()
		w.commits.Add(1)
		w.bytes.Add(uint64(st.GetPageAlloc()) + meta)
	})
}

// WriteMetrics writes the store's families: the file's size and free
// space, the commits and bytes written since the store was opened, and
// the number of desired objects by kind. What cannot be read (a closed
// store) is left out.
func (s *Store) WriteMetrics(p *promtext.Writer) {
	if fi, err := os.Stat(s.path); err == nil {
		p.Family("outpost_store_file_size_bytes", "Size of the store file in bytes.", promtext.Gauge)
		p.Sample("outpost_store_file_size_bytes", float64(fi.Size()))
	}
	p.Family("outpost_store_free_bytes", "Bytes of the store file in free pages, which later writes reuse (the file never shrinks), as of the last write.", promtext.Gauge)
	p.Sample("outpost_store_free_bytes", float64(s.db.Stats().FreeAlloc))
	p.Family("outpost_store_commits_total", "Write transactions the store committed since it was opened.", promtext.Counter)
	p.Sample("outpost_store_commits_total", float64(s.writes.commits.Load()))
	p.Family("outpost_store_written_bytes_total", "Bytes the store's commits wrote to its file (whole pages, meta page included) since it was opened.", promtext.Counter)
	p.Sample("outpost_store_written_bytes_total", float64(s.writes.bytes.Load()))

	counts := make([]int, len(kinds))
	err := s.db.View(func(tx *bolt.Tx) error {
		for i, k := range kinds {
			if b := tx.Bucket(k.bucket()); b != nil {
				counts[i] = b.Stats().KeyN
			}
		}
		return nil
	})
	if err != nil {
		return
	}
	p.Family("outpost_store_objects", "Desired objects in the store, by kind.", promtext.Gauge)
	for i, k := range kinds {
		p.Sample("outpost_store_objects", float64(counts[i]), "kind", string(k))
	}
}
