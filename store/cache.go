package store

import (
	"errors"
	"hash/maphash"
)

// Cache keeps the decoded objects of one kind between lists
// (Collection.ListCached), each under its key with a hash of its stored
// bytes, so that a list decodes only what changed since the last one: a
// proxy that rebuilds its rules from 10,000 Services at every pod status
// change reads them, but decodes none. The objects a cached list returns
// are shared with later lists, so callers must not change them. A Cache
// is for one goroutine.
type Cache[P Object] struct {
	seed    maphash.Seed
	entries map[string]*cacheEntry[P]
	gen     uint64
}

type cacheEntry[P Object] struct {
	sum uint64 // maphash of the stored value
	n   int    // its length
	rec Record[P]
	gen uint64 // the last list that saw it
}

// NewCache returns an empty Cache.
func NewCache[P Object]() *Cache[P] {
	return &Cache[P]{seed: maphash.MakeSeed(), entries: map[string]*cacheEntry[P]{}}
}

// Len returns the number of objects the cache holds.
func (c *Cache[P]) Len() int { return len(c.entries) }

// ListCached is List through cache: an object whose stored bytes are
// those of the last list comes from the cache, not decoded again; objects
// gone from the store leave the cache.
func (c Collection[T, P]) ListCached(cache *Cache[P]) ([]Record[P], error) {
	cache.gen++
	out := make([]Record[P], 0, len(cache.entries))
	var errs []error
	err := c.each(func(k, v []byte) {
		sum := maphash.Bytes(cache.seed, v)
		e := cache.entries[string(k)]
		if e != nil && e.sum == sum && e.n == len(v) {
			e.gen = cache.gen
			out = append(out, e.rec)
			return
		}
		rec, err := c.decode(k, v)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if e == nil {
			e = &cacheEntry[P]{}
			cache.entries[string(k)] = e
		}
		*e = cacheEntry[P]{sum: sum, n: len(v), rec: rec, gen: cache.gen}
		out = append(out, rec)
	})
	if err != nil {
		return nil, err
	}
	for k, e := range cache.entries {
		if e.gen != cache.gen {
			delete(cache.entries, k)
		}
	}
	return out, errors.Join(errs...)
}
