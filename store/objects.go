package store

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Kind names a kind of stored data; subscriptions are per kind.
type Kind string

// The kinds of stored data.
const (
	KindPod           Kind = "pods"
	KindService       Kind = "services"
	KindEndpointSlice Kind = "endpointslices"
	KindConfigMap     Kind = "configmaps"
	KindSecret        Kind = "secrets"
	KindJournal       Kind = "journal"
	KindIPAM          Kind = "ipam"
	KindRestart       Kind = "restarts"
)

// kinds lists the kinds of desired objects, each with its own bucket.
var kinds = []Kind{KindPod, KindService, KindEndpointSlice, KindConfigMap, KindSecret}

func (k Kind) bucket() []byte { return []byte(k) }

// Source says where a desired object came from.
type Source uint8

// The sources of desired state.
const (
	SourceAPI    Source = 1 // the Kubernetes API server
	SourceStatic Source = 2 // a manifest file in manifestDir
	SourceMQTT   Source = 3 // a retained MQTT message
)

// String returns the source's name as the CLI and config spell it.
func (s Source) String() string {
	switch s {
	case SourceAPI:
		return "api"
	case SourceStatic:
		return "static"
	case SourceMQTT:
		return "mqtt"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

func (s Source) valid() bool { return s >= SourceAPI && s <= SourceMQTT }

// Object is what a desired-state bucket holds: a Kubernetes object with its
// generated protobuf codec.
type Object interface {
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
	GetNamespace() string
	GetName() string
}

// Record is a stored object with the source that owns it.
type Record[P Object] struct {
	Source Source
	Object P
}

// Collection is the typed accessor for one kind of desired object.
type Collection[T any, P interface {
	*T
	Object
}] struct {
	s    *Store
	kind Kind
}

// Pods returns the desired pods.
func (s *Store) Pods() Collection[corev1.Pod, *corev1.Pod] {
	return Collection[corev1.Pod, *corev1.Pod]{s, KindPod}
}

// Services returns the desired services.
func (s *Store) Services() Collection[corev1.Service, *corev1.Service] {
	return Collection[corev1.Service, *corev1.Service]{s, KindService}
}

// EndpointSlices returns the stored endpoint slices.
func (s *Store) EndpointSlices() Collection[discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice] {
	return Collection[discoveryv1.EndpointSlice, *discoveryv1.EndpointSlice]{s, KindEndpointSlice}
}

// ConfigMaps returns the stored config maps.
func (s *Store) ConfigMaps() Collection[corev1.ConfigMap, *corev1.ConfigMap] {
	return Collection[corev1.ConfigMap, *corev1.ConfigMap]{s, KindConfigMap}
}

// Secrets returns the stored secrets.
func (s *Store) Secrets() Collection[corev1.Secret, *corev1.Secret] {
	return Collection[corev1.Secret, *corev1.Secret]{s, KindSecret}
}

// Key returns the store key of a namespaced object.
func Key(namespace, name string) string { return namespace + "/" + name }

// Put stores obj as owned by src. It writes nothing (and notifies no one)
// when the stored value is already identical, and fails with
// ErrSourceConflict when another source owns an object of that name.
func (c Collection[T, P]) Put(src Source, obj P) error {
	_, err := c.put(src, obj, Resume{})
	return err
}

// Resume is a watch's resume version (SetResumeVersion) that PutResumed
// or DeleteResumed record in the same transaction as the object: a watch
// event costs one commit, not two, and the store never holds the object
// without the version its watch would resume from. The zero Resume
// records nothing.
type Resume struct {
	Resource, Version string
}

func (r Resume) record(tx *bolt.Tx) error {
	if r.Resource == "" || r.Version == "" {
		return nil
	}
	return putResumeVersion(tx, r.Resource, r.Version)
}

// PutResumed is Put, recording r in the same transaction (also when the
// stored value is already identical). On an error neither is written.
func (c Collection[T, P]) PutResumed(src Source, obj P, r Resume) error {
	_, err := c.put(src, obj, r)
	return err
}

func (c Collection[T, P]) put(src Source, obj P, r Resume) (bool, error) {
	key := Key(obj.GetNamespace(), obj.GetName())
	val, err := encodeRecord(src, obj)
	if err != nil {
		return false, fmt.Errorf("store %s %s: %w", c.kind, key, err)
	}
	var changed bool
	err = c.s.batch(func(tx *bolt.Tx) error {
		changed = false
		b := tx.Bucket(c.kind.bucket())
		old := b.Get([]byte(key))
		if old != nil {
			if bytes.Equal(old, val) {
				return r.record(tx)
			}
			if oldSrc, err := recordSource(old); err == nil && oldSrc != src {
				return fmt.Errorf("store %s %s from %s: %w (%s)", c.kind, key, src, ErrSourceConflict, oldSrc)
			}
		}
		changed = true
		c.s.addSrcKey(c.kind, src, key)
		if err := b.Put([]byte(key), val); err != nil {
			return err
		}
		return r.record(tx)
	})
	if changed && err == nil {
		c.s.notify(c.kind, key)
	}
	return changed, err
}

// Get returns the object stored under namespace/name.
func (c Collection[T, P]) Get(namespace, name string) (Record[P], bool, error) {
	var rec Record[P]
	var found bool
	key := Key(namespace, name)
	err := c.s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(c.kind.bucket())
		if b == nil {
			return nil
		}
		v := b.Get([]byte(key))
		if v == nil {
			return nil
		}
		found = true
		var err error
		rec, err = c.decode([]byte(key), v)
		return err
	})
	return rec, found, err
}

// List returns every stored object of this kind, in key order. A value that
// cannot be decoded is reported, naming its key, after the others are read.
func (c Collection[T, P]) List() ([]Record[P], error) {
	var out []Record[P]
	var errs []error
	err := c.each(func(k, v []byte) {
		rec, err := c.decode(k, v)
		if err != nil {
			errs = append(errs, err)
			return
		}
		out = append(out, rec)
	})
	if err != nil {
		return nil, err
	}
	return out, errors.Join(errs...)
}

// GetKeys returns the objects stored under keys (namespace/name), in one
// read transaction, by key; a key with nothing stored is not in the map.
// A value that cannot be decoded is reported, naming its key, after the
// others are read.
func (c Collection[T, P]) GetKeys(keys []string) (map[string]Record[P], error) {
	out := make(map[string]Record[P], len(keys))
	if len(keys) == 0 {
		return out, nil // no transaction for nothing: a sync's common case
	}
	var errs []error
	err := c.s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(c.kind.bucket())
		if b == nil {
			return nil
		}
		for _, k := range keys {
			v := b.Get([]byte(k))
			if v == nil {
				continue
			}
			rec, err := c.decode([]byte(k), v)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out[k] = rec
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, errors.Join(errs...)
}

// Keys returns the keys (namespace/name) of every stored object of this
// kind, in order, decoding none.
func (c Collection[T, P]) Keys() ([]string, error) {
	var out []string
	err := c.each(func(k, _ []byte) { out = append(out, string(k)) })
	return out, err
}

// KeysFrom returns the keys (namespace/name) of the stored objects of
// this kind that src (not the API server) may have put: every one it
// did, and perhaps a few it no longer holds. It reads no record; ok is
// false for SourceAPI, whose keys it does not keep apart.
func (c Collection[T, P]) KeysFrom(src Source) (keys []string, ok bool) {
	return c.s.srcKeyList(c.kind, src)
}

// ListNamespace returns the stored objects of this kind in namespace ns,
// in name order, reading only those.
func (c Collection[T, P]) ListNamespace(ns string) ([]Record[P], error) {
	var out []Record[P]
	var errs []error
	prefix := []byte(ns + "/")
	err := c.s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(c.kind.bucket())
		if b == nil {
			return nil
		}
		cur := b.Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			rec, err := c.decode(k, v)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, rec)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, errors.Join(errs...)
}

// each calls fn with every stored key and value of this kind, in key
// order, in one read transaction; the bytes are valid only during fn.
func (c Collection[T, P]) each(fn func(k, v []byte)) error {
	return c.s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(c.kind.bucket())
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			fn(k, v)
			return nil
		})
	})
}

// decode decodes the stored value v of key k.
func (c Collection[T, P]) decode(k, v []byte) (Record[P], error) {
	rec, err := decodeRecord[T, P](v)
	if err != nil {
		return rec, fmt.Errorf("decode %s %s: %w", c.kind, k, err)
	}
	return rec, nil
}

// Delete removes namespace/name and reports whether it was there.
func (c Collection[T, P]) Delete(namespace, name string) (bool, error) {
	return c.DeleteResumed(namespace, name, Resume{})
}

// DeleteResumed is Delete, recording r in the same transaction (also when
// namespace/name is not there). On an error neither is written.
func (c Collection[T, P]) DeleteResumed(namespace, name string, r Resume) (bool, error) {
	key := []byte(Key(namespace, name))
	var found bool
	err := c.s.batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(c.kind.bucket())
		found = b.Get(key) != nil
		if !found {
			return r.record(tx)
		}
		if err := b.Delete(key); err != nil {
			return err
		}
		return r.record(tx)
	})
	if found && err == nil {
		c.s.notify(c.kind, string(key))
	}
	return found, err
}

// Replace makes objs the complete set of this kind owned by src, in one
// transaction: objects of src that are not in objs are deleted, objects of
// other sources are left alone. An object whose name another source owns is
// skipped and reported in the error; the rest are still written. Replace
// returns how many records it changed.
func (c Collection[T, P]) Replace(src Source, objs []P) (int, error) {
	vals := make(map[string][]byte, len(objs))
	var errs []error
	for _, o := range objs {
		key := Key(o.GetNamespace(), o.GetName())
		v, err := encodeRecord(src, o)
		if err != nil {
			errs = append(errs, fmt.Errorf("store %s %s: %w", c.kind, key, err))
			continue
		}
		vals[key] = v
	}
	// Most calls (a periodic re-read of the manifests) change nothing:
	// look first, so an unchanged set costs no write transaction, no
	// fsync and no flash wear.
	var conflicts []error
	var dirty bool
	if err := c.s.db.View(func(tx *bolt.Tx) error {
		stale, puts, conf := c.replaceDiff(tx, src, vals, false)
		dirty, conflicts = len(stale)+len(puts) > 0, conf
		return nil
	}); err != nil {
		return 0, err
	}
	if !dirty {
		return 0, errors.Join(append(errs, conflicts...)...)
	}
	var changed int
	var keys []string
	err := c.s.batch(func(tx *bolt.Tx) error {
		stale, puts, conf := c.replaceDiff(tx, src, vals, true)
		changed, conflicts, keys = 0, conf, keys[:0]
		b := tx.Bucket(c.kind.bucket())
		for _, k := range stale {
			if err := b.Delete(k); err != nil {
				return err
			}
			keys = append(keys, string(k))
			changed++
		}
		for _, k := range puts {
			c.s.addSrcKey(c.kind, src, k)
			if err := b.Put([]byte(k), vals[k]); err != nil {
				return err
			}
			keys = append(keys, k)
			changed++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if changed > 0 {
		c.s.notify(c.kind, keys...)
	}
	return changed, errors.Join(append(errs, conflicts...)...)
}

// replaceDiff is what Replace(src, vals) must do in tx: the keys of src's
// records to delete, the keys to put (sorted), and the keys another source
// owns. For a source other than the API server only the keys that may be
// src's are read (Store.srcKeys); in a write transaction (write set) the
// ones found not to be are forgotten.
func (c Collection[T, P]) replaceDiff(tx *bolt.Tx, src Source, vals map[string][]byte, write bool) (stale [][]byte, puts []string, conflicts []error) {
	b := tx.Bucket(c.kind.bucket())
	if keys, ok := c.s.srcKeyList(c.kind, src); ok {
		slices.Sort(keys)
		for _, k := range keys {
			v := b.Get([]byte(k))
			if s, err := recordSource(v); v == nil || err != nil || s != src {
				if write && v == nil {
					c.s.dropSrcKey(c.kind, src, k)
				}
				continue
			}
			if _, keep := vals[k]; !keep {
				stale = append(stale, []byte(k))
			}
		}
	} else {
		b.ForEach(func(k, v []byte) error {
			if s, err := recordSource(v); err == nil && s == src {
				if _, keep := vals[string(k)]; !keep {
					stale = append(stale, append([]byte(nil), k...))
				}
			}
			return nil
		})
	}
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		old := b.Get([]byte(k))
		if bytes.Equal(old, vals[k]) {
			continue
		}
		if old != nil {
			if s, err := recordSource(old); err == nil && s != src {
				conflicts = append(conflicts, fmt.Errorf("store %s %s from %s: %w (%s)", c.kind, k, src, ErrSourceConflict, s))
				continue
			}
		}
		puts = append(puts, k)
	}
	return stale, puts, conflicts
}

// DesiredPodStatus is the part of a pod's status that is desired state
// for its node and is stored with the pod: the conditions named by its
// readiness gates, which controllers set and the node reads to say whether
// the pod is ready. The rest of the status is the node's to say; storing
// it would rewrite the pod on every status change.
func DesiredPodStatus(pod *corev1.Pod) corev1.PodStatus {
	var st corev1.PodStatus
	for _, g := range pod.Spec.ReadinessGates {
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType {
				st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status})
			}
		}
	}
	return st
}
