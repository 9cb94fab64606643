package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Reserve records ip as allocated to owner (a pod UID). Reserving an
// address already held by owner succeeds; one held by another owner fails.
func (s *Store) Reserve(ip, owner string) error {
	if ip == "" || owner == "" {
		return fmt.Errorf("ipam reserve %q for %q: address and owner are required", ip, owner)
	}
	var changed bool
	err := s.batch(func(tx *bolt.Tx) error {
		changed = false
		b := tx.Bucket(bucketIPAM)
		if cur := b.Get([]byte(ip)); cur != nil {
			if string(cur) == owner {
				return nil
			}
			return fmt.Errorf("ipam reserve %s for %s: held by %s", ip, owner, cur)
		}
		changed = true
		return b.Put([]byte(ip), []byte(owner))
	})
	if changed {
		s.notify(KindIPAM)
	}
	return err
}

// Release frees every address held by owner and returns them.
func (s *Store) Release(owner string) ([]string, error) {
	var freed []string
	err := s.batch(func(tx *bolt.Tx) error {
		freed = nil
		b := tx.Bucket(bucketIPAM)
		err := b.ForEach(func(k, v []byte) error {
			if string(v) == owner {
				freed = append(freed, string(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, ip := range freed {
			if err := b.Delete([]byte(ip)); err != nil {
				return err
			}
		}
		return nil
	})
	if len(freed) > 0 && err == nil {
		s.notify(KindIPAM)
	}
	return freed, err
}

// Allocations returns every allocated address and its owner.
func (s *Store) Allocations() (map[string]string, error) {
	out := map[string]string{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIPAM)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			out[string(k)] = string(v)
			return nil
		})
	})
	return out, err
}
