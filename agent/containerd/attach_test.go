package containerd

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// blockedClient is an attached client that reads nothing until let go.
type blockedClient struct {
	let chan struct{}
	mu  sync.Mutex
	b   bytes.Buffer
}

func (c *blockedClient) Write(p []byte) (int, error) {
	<-c.let
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.Write(p)
}

// The output of a container reaches an attached client through a queue:
// writing it never waits for the client, which gets all of it in order,
// the rest when the attach ends.
func TestAttachQueueNeverWaitsForTheClient(t *testing.T) {
	c := &blockedClient{let: make(chan struct{})}
	gone := false
	q := newAttachQueue(c, func() { gone = true })
	finish := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { q.run(finish) })
	var want strings.Builder
	for i := range 100 {
		line := strings.Repeat(string(rune('a'+i%26)), 100) + "\n"
		want.WriteString(line)
		if _, err := q.Write([]byte(line)); err != nil { // the client reads nothing yet
			t.Fatalf("write %d: %v", i, err)
		}
	}
	close(c.let)
	close(finish)
	wg.Wait()
	if c.b.String() != want.String() {
		t.Fatalf("client got %d bytes, want the %d written, in order", c.b.Len(), want.Len())
	}
	if gone {
		t.Fatal("a client that read everything was taken as gone")
	}
}

// A client that lets attachQueueBytes of output wait is taken as gone,
// and what comes after is not queued for it.
func TestAttachQueueDropsATooSlowClient(t *testing.T) {
	c := &blockedClient{let: make(chan struct{})}
	gone := make(chan struct{})
	q := newAttachQueue(c, func() { close(gone) })
	chunk := make([]byte, 64<<10)
	var err error
	for i := 0; i <= attachQueueBytes/len(chunk)+1 && err == nil; i++ {
		_, err = q.Write(chunk)
	}
	if err == nil {
		t.Fatal("the queue took more than attachQueueBytes for a client reading nothing")
	}
	<-gone
	if _, err := q.Write([]byte("x")); err == nil {
		t.Fatal("queued output for a client taken as gone")
	}
	close(c.let)
	finish := make(chan struct{})
	close(finish)
	q.run(finish) // returns at once: the client has gone
}
