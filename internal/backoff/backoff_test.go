package backoff

import (
	"testing"
	"time"
)

func TestBackoffDoublesWithJitterUpToMax(t *testing.T) {
	b := Backoff{Min: time.Second, Max: 8 * time.Second}
	for i, ceil := range []time.Duration{1, 2, 4, 8, 8, 8} {
		ceil *= time.Second
		d := b.Next()
		if d < ceil/2 || d > ceil {
			t.Errorf("try %d: %v, want within [%v, %v]", i, d, ceil/2, ceil)
		}
	}
	b.Reset()
	if d := b.Next(); d > time.Second {
		t.Errorf("after Reset: %v, want at most Min", d)
	}
}
