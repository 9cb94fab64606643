package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve serves h on the pipe's Listener until the test ends.
func (p *pipe) serve(t *testing.T, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(p.l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
}

// transport is an HTTP transport to the node over the pipe; dials counts
// its streams.
func (p *pipe) transport(dials *atomic.Int32) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			return p.d.Dial(ctx, node)
		},
	}
}

// front serves the node's kubelet API at the bridge, as the bridge does:
// a reverse proxy that flushes at once.
func (p *pipe) front(t *testing.T) *httptest.Server {
	tr := p.transport(nil)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", node, node
		},
		Transport:     tr,
		FlushInterval: -1,
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	return srv
}

func TestHTTPLargeResponse(t *testing.T) {
	p := newPipe(t, pipeConfig{Latency: time.Millisecond})
	body := randomBytes(5<<20, 20)
	p.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Streamed: no Content-Length, in odd pieces.
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 7919)
			if _, err := w.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
	}))
	for _, tc := range []struct {
		name string
		url  string
		rt   http.RoundTripper
	}{
		{"direct", "http://" + node + "/containerLogs/default/web/app", p.transport(nil)},
		{"through the bridge's proxy", p.front(t).URL + "/containerLogs/default/web/app", http.DefaultTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := (&http.Client{Transport: tc.rt, Timeout: time.Minute}).Get(tc.url)
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("body of %d bytes, not the %d sent", len(got), len(body))
			}
		})
	}
}

func TestHTTPStreamsLineByLine(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	next := make(chan struct{})
	p.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 5 {
			fmt.Fprintf(w, "line %d\n", i)
			w.(http.Flusher).Flush()
			// The next line only once the client read this one: a line
			// that waited for more to fill a buffer would never arrive.
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	resp, err := http.Get(p.front(t).URL + "/containerLogs/default/web/app?follow=true")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 5 {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("line %d\n", i) {
			t.Fatalf("line %d: %q, %v", i, line, err)
		}
		next <- struct{}{}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the lines: %q, %v", rest, err)
	}
}

func TestHTTPUpgradeThroughProxy(t *testing.T) {
	p := newPipe(t, pipeConfig{Window: 8 << 10, FrameSize: 1 << 10})
	handlerDone := make(chan error, 1)
	p.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
			return
		}
		// As kubelet's SPDY exec: hijack, then a protocol of its own.
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			handlerDone <- err
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err == io.EOF {
				handlerDone <- nil
				return
			}
			if err != nil {
				handlerDone <- err
				return
			}
			if _, err := conn.Write([]byte(strings.ToUpper(line))); err != nil {
				handlerDone <- err
				return
			}
		}
	}))
	req, _ := http.NewRequest("POST", p.front(t).URL+"/exec/default/web/app?command=sh", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d, want 101: %s", resp.StatusCode, body)
	}
	rwc := resp.Body.(io.ReadWriteCloser)
	// Both ways at once, more than a window each way.
	const lines = 2000
	wrote := make(chan error, 1)
	go func() {
		for i := range lines {
			if _, err := fmt.Fprintf(rwc, "stdin %d of the exec session\n", i); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	br := bufio.NewReader(rwc)
	for i := range lines {
		line, err := br.ReadString('\n')
		if want := fmt.Sprintf("STDIN %d OF THE EXEC SESSION\n", i); err != nil || line != want {
			t.Fatalf("echo %d: %q, %v; want %q", i, line, err, want)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	rwc.Close()
	select {
	case err := <-handlerDone:
		if err != nil {
			t.Fatalf("node's end: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the node's end did not see the client go within 10 s")
	}
}

func TestHTTPKeepAliveReusesTheStream(t *testing.T) {
	p := newPipe(t, pipeConfig{})
	p.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# HELP up\nup 1\n")
	}))
	var dials atomic.Int32
	c := &http.Client{Transport: p.transport(&dials), Timeout: 10 * time.Second}
	for i := range 20 {
		resp, err := c.Get("http://" + node + "/metrics")
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "# HELP up\nup 1\n" {
			t.Fatalf("get %d: %q, %v", i, body, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d streams for 20 requests, want 1 kept alive", n)
	}
	c.CloseIdleConnections()
	eventually(t, "the node to see the stream go", func() bool { return p.l.Streams() == 0 })
}
