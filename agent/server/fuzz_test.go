package server

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzLogOptions feeds containerLogs' query parser arbitrary queries: it
// never panics, and every error is a 400 naming one of the parameters.
func FuzzLogOptions(f *testing.F) {
	for _, q := range []string{"follow=true&tailLines=10", "sinceSeconds=5&sinceTime=x", "limitBytes=0", "previous=1&timestamps=false", "tailLines=99999999999999999999"} {
		f.Add(q)
	}
	params := []string{"follow", "previous", "timestamps", "tailLines", "limitBytes", "sinceSeconds", "sinceTime"}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		opts, _, err := logOptions(q, time.Unix(1e9, 0))
		if err != nil {
			he, ok := err.(*httpError)
			if !ok || he.code != http.StatusBadRequest {
				t.Fatalf("%q: error %v is not a 400", raw, err)
			}
			named := false
			for _, p := range params {
				named = named || strings.HasPrefix(he.msg, p+":")
			}
			if !named {
				t.Fatalf("%q: error %q names no parameter", raw, he.msg)
			}
			return
		}
		if opts.TailLines < -1 || opts.LimitBytes < 0 {
			t.Fatalf("%q: accepted %+v", raw, opts)
		}
	})
}
