package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// RestartState is what the agent remembers of one container across its own
// restarts and reboots: the restart count and crash-loop backoff.
type RestartState struct {
	Count        int32     `json:"count"`
	LastExitCode int32     `json:"lastExitCode"`
	LastFinished time.Time `json:"lastFinished,omitzero"`
	BackoffUntil time.Time `json:"backoffUntil,omitzero"`
	Backoff      int64     `json:"backoffNanos,omitempty"`
}

func restartKey(podUID, container string) []byte { return []byte(podUID + "/" + container) }

// PutRestart records the restart state of a container of pod podUID.
func (s *Store) PutRestart(podUID, container string, st RestartState) error {
	v, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("restart state %s/%s: %w", podUID, container, err)
	}
	err = s.batch(func(tx *bolt.Tx) error { return tx.Bucket(bucketRestarts).Put(restartKey(podUID, container), v) })
	if err == nil {
		s.notify(KindRestart)
	}
	return err
}

// Restart returns the recorded restart state of a container.
func (s *Store) Restart(podUID, container string) (RestartState, bool, error) {
	var st RestartState
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRestarts)
		if b == nil {
			return nil
		}
		v := b.Get(restartKey(podUID, container))
		if v == nil {
			return nil
		}
		found = true
		return decodeRestart(v, &st)
	})
	if err != nil {
		return st, found, fmt.Errorf("restart state %s/%s: %w", podUID, container, err)
	}
	return st, found, nil
}

func decodeRestart(v []byte, st *RestartState) error {
	if err := json.Unmarshal(v, st); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if st.Count < 0 {
		return fmt.Errorf("decode: negative restart count %d", st.Count)
	}
	return nil
}

// DeleteRestarts forgets the restart state of every container of podUID.
func (s *Store) DeleteRestarts(podUID string) error {
	prefix := podUID + "/"
	return s.batch(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRestarts).Cursor()
		for k, _ := c.Seek([]byte(prefix)); k != nil && strings.HasPrefix(string(k), prefix); k, _ = c.Seek([]byte(prefix)) {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}
