package main

import "context"

// parts are the running parts of a command, started in order and
// stopped in reverse, as deferred calls run: a part stops only after
// every part started after it, which may use it, has stopped. The zero
// value is ready; one goroutine starts and stops the parts.
type parts struct {
	stops []func()
}

// start runs run in a goroutine of its own, on a context that ends when
// ctx does or when the part is stopped. Stopping it waits for run to
// return.
func (p *parts) start(ctx context.Context, run func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	p.onStop(func() { cancel(); <-done })
}

// onStop adds a part that has no goroutine, only something to undo at
// its turn: a Close, an unsubscribe.
func (p *parts) onStop(stop func()) {
	p.stops = append(p.stops, stop)
}

// stop stops the parts in reverse order, each after the one started
// after it has returned, and forgets them.
func (p *parts) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
	p.stops = nil
}
