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

// notify wakes the subscribers of kind k after a write that changed the
// objects under keys (of the kinds that have keys), recording the keys
// in the kind's Feeds first.
func (s *Store) notify(k Kind, keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.feeds[k] {
		f.add(k, keys)
	}
	for _, c := range s.subs[k] {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}
