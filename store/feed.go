package store

import (
	"maps"
	"slices"
)

// maxFeedKeys is how many changed keys a Feed holds before it gives up
// on them and reports that everything may have changed: a reader that
// fell that far behind reads everything again, which costs less than
// reading so many objects one by one.
const maxFeedKeys = 4096

// Feed collects the keys of the objects of some kinds that writes changed
// (put, replaced or deleted), for a reader that keeps its own decoded copy
// of them and reads again only what changed: the service proxy, with
// 10,000 Services of which one changed. It does not wake the reader:
// Subscribe does. A Feed is safe for concurrent use.
type Feed struct {
	s        *Store
	kinds    []Kind
	keys     map[Kind]map[string]struct{}
	n        int
	overflow bool // too many keys, or closed: read everything
}

// Feed starts collecting the changed keys of kinds. Until its first Take
// it reports everything as changed, since what was written before it
// started is not known.
func (s *Store) Feed(kinds ...Kind) *Feed {
	f := &Feed{s: s, kinds: kinds, keys: map[Kind]map[string]struct{}{}, overflow: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range kinds {
		s.feeds[k] = append(s.feeds[k], f)
	}
	return f
}

// Take returns the keys changed since the last Take, sorted, by kind,
// and forgets them. When all is true the keys are not known (the first
// Take, too many changes, or a closed Feed) and the reader must read
// every object again.
func (f *Feed) Take() (keys map[Kind][]string, all bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if f.overflow {
		f.overflow = f.kinds == nil // a closed Feed stays so
		return nil, true
	}
	keys = make(map[Kind][]string, len(f.keys))
	for k, set := range f.keys {
		keys[k] = slices.Sorted(maps.Keys(set))
	}
	clear(f.keys)
	f.n = 0
	return keys, false
}

// Close stops the Feed; from then on Take reports everything as changed.
func (f *Feed) Close() {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	for _, k := range f.kinds {
		f.s.feeds[k] = slices.DeleteFunc(f.s.feeds[k], func(x *Feed) bool { return x == f })
	}
	f.kinds, f.overflow, f.n = nil, true, 0
	clear(f.keys)
}

// add records keys of kind k; s.mu is held.
func (f *Feed) add(k Kind, keys []string) {
	if f.overflow {
		return
	}
	set := f.keys[k]
	if set == nil {
		set = map[string]struct{}{}
		f.keys[k] = set
	}
	for _, key := range keys {
		if _, ok := set[key]; ok {
			continue
		}
		if f.n == maxFeedKeys {
			f.overflow, f.n = true, 0
			clear(f.keys)
			return
		}
		set[key] = struct{}{}
		f.n++
	}
}
