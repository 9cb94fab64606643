package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Entry is one object's newest unsent status in the journal.
type Entry struct {
	// Key names the object, for example "pod/default/web".
	Key string
	// Seq is the sequence number of the write; later writes get higher ones.
	Seq uint64
	// Value is the status as the writer encoded it.
	Value []byte
}

// Append records value as the newest status of key and returns its sequence
// number. An older unsent value of the same key is replaced, so it is never
// sent.
func (s *Store) Append(key string, value []byte) (uint64, error) {
	if key == "" {
		return 0, errors.New("journal append: empty key")
	}
	var seq uint64
	err := s.batch(func(tx *bolt.Tx) error {
		j, idx := tx.Bucket(bucketJournal), tx.Bucket(bucketJournalSeq)
		if old := j.Get([]byte(key)); old != nil {
			oldSeq, _, err := decodeEntry(old)
			if err != nil {
				return fmt.Errorf("journal %s: %w", key, err)
			}
			if err := idx.Delete(u64(oldSeq)); err != nil {
				return err
			}
		}
		var err error
		if seq, err = idx.NextSequence(); err != nil {
			return err
		}
		if err := j.Put([]byte(key), encodeEntry(seq, value)); err != nil {
			return err
		}
		return idx.Put(u64(seq), []byte(key))
	})
	if err != nil {
		return 0, fmt.Errorf("journal append %s: %w", key, err)
	}
	s.notify(KindJournal)
	return seq, nil
}

// Pending returns up to limit unsent entries with a sequence number above
// after, oldest first. limit <= 0 means all.
func (s *Store) Pending(after uint64, limit int) ([]Entry, error) {
	var out []Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		j, idx := tx.Bucket(bucketJournal), tx.Bucket(bucketJournalSeq)
		if j == nil || idx == nil {
			return nil
		}
		c := idx.Cursor()
		for k, v := c.Seek(u64(after + 1)); k != nil; k, v = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			raw := j.Get(v)
			if raw == nil {
				return fmt.Errorf("journal index %d names missing key %q", binary.BigEndian.Uint64(k), v)
			}
			seq, val, err := decodeEntry(raw)
			if err != nil {
				return fmt.Errorf("journal %s: %w", v, err)
			}
			out = append(out, Entry{Key: string(v), Seq: seq, Value: append([]byte(nil), val...)})
		}
		return nil
	})
	return out, err
}

// Ack removes e from the journal if it is still the newest value of its
// key, and reports whether it did. An entry superseded since it was read
// stays, so the newer value is sent too.
func (s *Store) Ack(e Entry) (bool, error) {
	var removed bool
	err := s.batch(func(tx *bolt.Tx) error {
		removed = false
		j, idx := tx.Bucket(bucketJournal), tx.Bucket(bucketJournalSeq)
		raw := j.Get([]byte(e.Key))
		if raw == nil {
			return nil
		}
		seq, _, err := decodeEntry(raw)
		if err != nil {
			return fmt.Errorf("journal %s: %w", e.Key, err)
		}
		if seq != e.Seq {
			return nil
		}
		removed = true
		if err := idx.Delete(u64(seq)); err != nil {
			return err
		}
		return j.Delete([]byte(e.Key))
	})
	if err != nil {
		return false, fmt.Errorf("journal ack %s: %w", e.Key, err)
	}
	return removed, nil
}

// Backlog returns how many entries wait to be sent.
func (s *Store) Backlog() (int, error) {
	var n int
	err := s.db.View(func(tx *bolt.Tx) error {
		if j := tx.Bucket(bucketJournal); j != nil {
			n = j.Stats().KeyN
		}
		return nil
	})
	return n, err
}

// encodeEntry lays out a journal value: the sequence number as 8 bytes big
// endian, then the value.
func encodeEntry(seq uint64, value []byte) []byte {
	out := make([]byte, 8, 8+len(value))
	binary.BigEndian.PutUint64(out, seq)
	return append(out, value...)
}

func decodeEntry(raw []byte) (uint64, []byte, error) {
	if len(raw) < 8 {
		return 0, nil, fmt.Errorf("entry of %d bytes is shorter than its sequence number", len(raw))
	}
	seq := binary.BigEndian.Uint64(raw)
	if seq == 0 {
		return 0, nil, errors.New("entry has sequence number 0")
	}
	return seq, raw[8:], nil
}
