package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout of the file this binary writes. A file with a
// newer version is refused; older versions are migrated on open.
const SchemaVersion = 1

// FileName is the store's file name inside the state directory.
const FileName = "outpost.db"

var (
	// ErrLocked means another process holds the store open.
	ErrLocked = errors.New("store is locked by another process")
	// ErrCorrupt means the file failed bbolt's checks.
	ErrCorrupt = errors.New("store is corrupt")
	// ErrSchemaTooNew means the file was written by a newer outpost.
	ErrSchemaTooNew = errors.New("store schema is newer than this binary")
	// ErrSourceConflict means an object is owned by another source.
	ErrSourceConflict = errors.New("object is owned by another source")
)

// Bucket names. Each kind of desired object has its own bucket.
var (
	bucketMeta       = []byte("meta")
	bucketJournal    = []byte("journal")
	bucketJournalSeq = []byte("journal-seq")
	bucketIPAM       = []byte("ipam")
	bucketRestarts   = []byte("restarts")
)

// Meta keys.
var (
	keySchema     = []byte("schema")
	keyNode       = []byte("node")
	keyWriteCheck = []byte("write-check")
	resumePrefix  = "rv/"
	allBuckets    = [][]byte{bucketMeta, bucketJournal, bucketJournalSeq, bucketIPAM, bucketRestarts}
	defaultTimout = 2 * time.Second
)

// Options configure Open.
type Options struct {
	// ReadOnly opens the file with a shared lock and refuses writes.
	ReadOnly bool
	// NodeName is recorded in a new store's meta bucket.
	NodeName string
	// LockTimeout bounds the wait for another process's lock (default 2s).
	LockTimeout time.Duration
	// SkipCheck skips the consistency check Open runs on the whole file.
	SkipCheck bool
	// Scratch is for a store emptied at every start, as the bridge's
	// stores of its nodes are: writes are not synced to disk, and each
	// goes at once, never gathered with others for one sync.
	Scratch bool
}

// Store is an open store file. Its methods are safe for concurrent use.
type Store struct {
	db   *bolt.DB
	path string
	// scratch: writes are not synced, nor batched (Options.Scratch).
	scratch bool

	mu    sync.Mutex
	subs  map[Kind][]chan struct{}
	feeds map[Kind][]*Feed

	// srcKeys holds, by kind and source, the keys that may hold a record
	// of a source other than the API server's: at least all that do, so
	// that Replace for a source finds its stale records without reading
	// every record of the kind (10,000 from the API server, every 20 s
	// for the manifests). Keys are added in the write transaction that
	// stores them and dropped in one that finds them gone; the write
	// lock orders both.
	srcMu   sync.Mutex
	srcKeys map[Kind]map[Source]map[string]struct{}

	writes writeStats // commits and bytes written, for metrics

	// writers counts the write transactions asked for and not yet done
	// (batch): a write with none other in flight commits at once.
	writers atomic.Int32

	// unmappedAt is txCount after the last Unmap (unmap_linux.go).
	unmappedAt atomic.Int64

	healthMu sync.Mutex
	writeErr error // the newest failed commit's, nil after one succeeds
}

// Open opens (or, unless read-only, creates) the store file at path. It
// fails with ErrLocked within opts.LockTimeout when another process holds
// the file, with ErrCorrupt when the file fails bbolt's checks (the file is
// left untouched), and with ErrSchemaTooNew for a file from a newer binary.
func Open(path string, opts Options) (s *Store, err error) {
	if opts.LockTimeout == 0 {
		opts.LockTimeout = defaultTimout
	}
	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
	}
	defer func() {
		// bbolt panics on some kinds of damage instead of returning an
		// error; either way the file is not ours to touch.
		if r := recover(); r != nil {
			s, err = nil, corruptError(path, fmt.Errorf("%v", r))
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        opts.LockTimeout,
		ReadOnly:       opts.ReadOnly,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("open store %s: %w (%s); stop it or use another stateDir", path, ErrLocked, lockHolder(path))
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return nil, corruptError(path, err)
	case err != nil:
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	db.NoSync = opts.Scratch
	s = &Store{db: db, path: path, scratch: opts.Scratch, subs: map[Kind][]chan struct{}{}, feeds: map[Kind][]*Feed{}, srcKeys: map[Kind]map[Source]map[string]struct{}{}}
	if err := s.init(opts); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func corruptError(path string, cause error) error {
	return fmt.Errorf("open store %s: %w: %v; outpost will not start on it and has not changed it: "+
		"move it aside (mv %s %s.corrupt) and start again to rebuild desired state from manifests and the API server, "+
		"or inspect it with 'bbolt check %s'", path, ErrCorrupt, cause, path, path, path)
}

func (s *Store) init(opts Options) error {
	if !opts.SkipCheck {
		err := s.db.View(func(tx *bolt.Tx) error {
			for cerr := range tx.Check() {
				return cerr
			}
			return nil
		})
		if err != nil {
			return corruptError(s.path, err)
		}
	}
	if err := s.db.View(s.indexSources); err != nil {
		return fmt.Errorf("open store %s: %w", s.path, err)
	}
	if opts.ReadOnly {
		return s.db.View(func(tx *bolt.Tx) error { return checkSchema(s.path, tx) })
	}
	if err := s.db.View(func(tx *bolt.Tx) error { return checkSchema(s.path, tx) }); err != nil {
		return err
	}
	// A store that is already laid out is not written at open: an agent
	// restarted on a full or failing disk still opens it.
	var ready bool
	s.db.View(func(tx *bolt.Tx) error { ready = laidOut(tx, opts.NodeName); return nil })
	if ready {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := checkSchema(s.path, tx); err != nil {
			return err
		}
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		for _, k := range kinds {
			if _, err := tx.CreateBucketIfNotExists(k.bucket()); err != nil {
				return fmt.Errorf("create bucket %s: %w", k, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keySchema, []byte(strconv.Itoa(SchemaVersion))); err != nil {
			return err
		}
		if opts.NodeName != "" {
			return meta.Put(keyNode, []byte(opts.NodeName))
		}
		return nil
	})
}

// laidOut reports whether tx has every bucket, this binary's schema
// version and, unless node is "", node as its node name: what init would
// write is there already.
func laidOut(tx *bolt.Tx, node string) bool {
	for _, b := range allBuckets {
		if tx.Bucket(b) == nil {
			return false
		}
	}
	for _, k := range kinds {
		if tx.Bucket(k.bucket()) == nil {
			return false
		}
	}
	meta := tx.Bucket(bucketMeta)
	if string(meta.Get(keySchema)) != strconv.Itoa(SchemaVersion) {
		return false
	}
	return node == "" || string(meta.Get(keyNode)) == node
}

// indexSources fills srcKeys from the records in tx.
func (s *Store) indexSources(tx *bolt.Tx) error {
	for _, k := range kinds {
		b := tx.Bucket(k.bucket())
		if b == nil {
			continue
		}
		err := b.ForEach(func(key, v []byte) error {
			if src, err := recordSource(v); err == nil {
				s.addSrcKey(k, src, string(key))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// addSrcKey records that key of kind k may hold a record of src.
func (s *Store) addSrcKey(k Kind, src Source, key string) {
	if src == SourceAPI {
		return
	}
	s.srcMu.Lock()
	defer s.srcMu.Unlock()
	bySrc := s.srcKeys[k]
	if bySrc == nil {
		bySrc = map[Source]map[string]struct{}{}
		s.srcKeys[k] = bySrc
	}
	keys := bySrc[src]
	if keys == nil {
		keys = map[string]struct{}{}
		bySrc[src] = keys
	}
	keys[key] = struct{}{}
}

// srcKeyList returns the keys of kind k that may hold a record of src
// (not the API server: ok is false, read every record).
func (s *Store) srcKeyList(k Kind, src Source) (keys []string, ok bool) {
	if src == SourceAPI {
		return nil, false
	}
	s.srcMu.Lock()
	defer s.srcMu.Unlock()
	return slices.Collect(maps.Keys(s.srcKeys[k][src])), true
}

// dropSrcKey forgets key of kind k for src; only a write transaction
// that found key holds no record of src may call it.
func (s *Store) dropSrcKey(k Kind, src Source, key string) {
	s.srcMu.Lock()
	defer s.srcMu.Unlock()
	delete(s.srcKeys[k][src], key)
}

func checkSchema(path string, tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return nil
	}
	v := meta.Get(keySchema)
	if v == nil {
		return nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return corruptError(path, fmt.Errorf("meta schema %q is not a number", v))
	}
	if n > SchemaVersion {
		return fmt.Errorf("open store %s: %w: file has schema %d, this outpost understands up to %d; "+
			"upgrade outpost, or move the file aside to start from an empty store", path, ErrSchemaTooNew, n, SchemaVersion)
	}
	return nil
}

// Path returns the file the store was opened from.
func (s *Store) Path() string { return s.path }

// Close closes the file. Subscriptions stay open but never fire again.
func (s *Store) Close() error { return s.db.Close() }

// Check runs bbolt's consistency check over the whole file.
func (s *Store) Check() error {
	return s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
}

// Meta is what the meta bucket records.
type Meta struct {
	Schema         int               `json:"schema"`
	NodeName       string            `json:"nodeName"`
	ResumeVersions map[string]string `json:"resumeVersions,omitempty"`
}

// Meta returns the schema version, node name and resume versions.
func (s *Store) Meta() (Meta, error) {
	var m Meta
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if b == nil {
			return nil
		}
		m.Schema, _ = strconv.Atoi(string(b.Get(keySchema)))
		m.NodeName = string(b.Get(keyNode))
		return b.ForEach(func(k, v []byte) error {
			if r, ok := cutPrefix(k, resumePrefix); ok {
				if m.ResumeVersions == nil {
					m.ResumeVersions = map[string]string{}
				}
				m.ResumeVersions[r] = string(v)
			}
			return nil
		})
	})
	return m, err
}

// ResumeVersion returns the resourceVersion a watch of resource last
// reached, or "" if none was recorded.
func (s *Store) ResumeVersion(resource string) (string, error) {
	var v string
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			v = string(b.Get([]byte(resumePrefix + resource)))
		}
		return nil
	})
	return v, err
}

// SetResumeVersion records the resourceVersion a watch of resource reached.
func (s *Store) SetResumeVersion(resource, version string) error {
	return s.batch(func(tx *bolt.Tx) error { return putResumeVersion(tx, resource, version) })
}

// putResumeVersion writes the resume version of resource in tx.
func putResumeVersion(tx *bolt.Tx, resource, version string) error {
	return tx.Bucket(bucketMeta).Put([]byte(resumePrefix+resource), []byte(version))
}

// batch runs fn in a write transaction, gathered with the writes of
// other goroutines into one commit and sync when they come together. fn
// may run more than once and must not keep state between runs. A commit
// the disk refuses is recorded for WriteError and returned marked
// (IsWriteFailure).
//
// bbolt's Batch waits MaxBatchDelay (10 ms) for company before it
// commits, so a lone writer (the pods watch storing one event after
// another) would wait that long for every write, whatever the disk: 30
// pods created at once reached the agent over 0.6 s. A write with no
// other in flight therefore commits at once; those that come while it
// commits gather in a batch, as before, and share the next sync.
func (s *Store) batch(fn func(tx *bolt.Tx) error) error {
	defer s.writers.Add(-1)
	run := s.db.Batch
	if s.writers.Add(1) == 1 || s.scratch {
		run = s.db.Update
	}
	var fnErr error
	err := run(func(tx *bolt.Tx) error {
		s.writes.count(tx)
		fnErr = fn(tx)
		return fnErr
	})
	return s.noteWrite(err, fnErr)
}

func cutPrefix(k []byte, prefix string) (string, bool) {
	if len(k) < len(prefix) || string(k[:len(prefix)]) != prefix {
		return "", false
	}
	return string(k[len(prefix):]), true
}

func u64(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}
