package store

// Subscribe returns a channel that receives a value after a write that
// changed any of the given kinds. Notifications coalesce: the channel holds
// at most one, and a reader re-reads the store to see what changed. Call
// cancel to stop the subscription.
func (s *Store) Subscribe(kinds ...Kind) (ch <-chan struct{}, cancel func()) {
	c := make(chan struct{}, 1)
	s.mu.Lock()
	for _, k := range kinds {
		s.subs[k] = append(s.subs[k], c)
	}
	s.mu.Unlock()
	return c, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, k := range kinds {
			list := s.subs[k]
			for i, x := range list {
				if x == c {
					s.subs[k] = append(list[:i:i], list[i+1:]...)
					break
				}
			}
		}
	}
}

func (s *Store) notify(k Kind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.subs[k] {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}
