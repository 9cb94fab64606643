package tunnel

import (
	"io"
	"testing"
)

// BenchmarkStreamThroughput writes 32 KiB at a time from the node to the
// bridge over the in-memory pipe, with the default window and frame
// size: the cost of the tunnel itself, without a broker.
func BenchmarkStreamThroughput(b *testing.B) {
	p := newPipe(b, pipeConfig{})
	bridge, nodeEnd := p.dial()
	chunk := randomBytes(32<<10, 30)
	read := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, bridge)
		read <- n
	}()
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := nodeEnd.Write(chunk); err != nil {
			b.Fatalf("write: %v", err)
		}
	}
	nodeEnd.CloseWrite()
	if n := <-read; n != int64(b.N*len(chunk)) {
		b.Fatalf("read %d bytes of %d", n, b.N*len(chunk))
	}
}
