//go:build pprof

package main

import (
	"net/http"
	_ "net/http/pprof" // the profiles, for a build with -tags pprof only
	"os"
)

// A build with -tags pprof serves net/http/pprof on OUTPOST_PPROF
// (HOST:PORT), to profile the agent or the bridge under a benchmark
// (BENCH_OUTPOST). Release builds have none of it.
func init() {
	if addr := os.Getenv("OUTPOST_PPROF"); addr != "" {
		go http.ListenAndServe(addr, nil)
	}
}
