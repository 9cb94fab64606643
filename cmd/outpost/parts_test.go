package main

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// Parts stop in reverse order of their start, and each stop waits until
// its goroutine has returned; a part that returned by itself does not
// hold the others up, and a second stop does nothing.
func TestPartsStopInReverse(t *testing.T) {
	var mu sync.Mutex
	var got []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
	}
	var ps parts
	ps.onStop(func() { note("close store") })
	for _, name := range []string{"proxy", "sync"} {
		started := make(chan struct{})
		ps.start(context.Background(), func(ctx context.Context) {
			close(started)
			<-ctx.Done()
			note(name + " returned")
		})
		<-started
	}
	done := make(chan struct{})
	ps.start(context.Background(), func(context.Context) { close(done) })
	<-done
	ps.onStop(func() { note("unsubscribe") })
	ps.stop()
	want := []string{"unsubscribe", "sync returned", "proxy returned", "close store"}
	if !slices.Equal(got, want) {
		t.Fatalf("stopped %q, want %q", got, want)
	}
	ps.stop()
	if len(got) != len(want) {
		t.Fatalf("a second stop did more: %q", got)
	}
}

// A part's context ends with the one it was started on.
func TestPartEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var ps parts
	defer ps.stop()
	returned := make(chan struct{})
	ps.start(ctx, func(ctx context.Context) {
		<-ctx.Done()
		close(returned)
	})
	cancel()
	<-returned
}
