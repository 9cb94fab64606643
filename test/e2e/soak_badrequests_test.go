package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

func init() { addSoakTrial(75, "BadRequests", soakBadRequests) }

// soakBadRequests is trial 7 of docs/soak.md, its kubelet API part:
// malformed requests from an authorized client (bad paths and query
// values, huge headers, slow and idle clients, invalid stream upgrades)
// to a standalone agent running one pod. Each is answered with a 4xx and
// a message (or, for slow and idle clients, the connection is closed in
// time); the agent does not crash, keeps serving, never runs the
// commands the requests carry, leaves its pod alone, and its store holds
// the same records after as before.
func soakBadRequests(t *testing.T, sc soakScale, r *soakResult) {
	rounds := sc.n(1, 10)
	slowConns, silentConns, idleConns := sc.n(40, 200), sc.n(20, 100), sc.n(20, 100)

	n := newNode(t, "soak-badreq")
	ip := n.hostLink()
	ca, err := env.NewCA("soak-badreq-ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(n.dir, "client-ca.crt")
	if err := ca.WriteCert(caFile); err != nil {
		t.Fatal(err)
	}
	n.appendConfig(fmt.Sprintf("server:\n  clientCAFile: %s\n", caFile))
	marker := newMarkerDir(t, n.dir)
	n.write("target.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: target}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: %s
    command: [sh, -c, 'for i in 1 2 3; do echo line $i; done; exec sleep 3600']
    volumeMounts: [{name: marker, mountPath: /marker}]
  volumes:
  - name: marker
    hostPath: {path: %s, type: Directory}
`, env.TestImage, marker.dir))
	pod := "target-" + n.name // a static pod, named as kubelet names its mirror
	n.start()
	n.waitPod(pod, 90*time.Second, "running", running)
	// The store's records before: read with the agent stopped (it holds
	// the store), then the agent starts again on its running pod.
	n.stop()
	recordsBefore := storeRecords(t, n)
	n.start()
	n.waitPod(pod, 60*time.Second, "running again", running)
	podsBefore := podFingerprint(mustStatus(t, n))

	certPEM, keyPEM, err := ca.Issue(pkix.Name{CommonName: "operator", Organization: []string{"system:masters"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	k := kapi{pod: pod, addr: net.JoinHostPort(ip, "10250"), tls: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{admin}}}
	pid := n.agent.Process.Pid
	fdsBefore := countFDs(pid)

	// The control: the same client runs a command that leaves a marker,
	// so a marker left by a bad request would show.
	if code, body, err := k.do(k.req("POST", "/run/default/"+k.pod+"/main?cmd=touch+/marker/control")); err != nil || code != 200 {
		t.Fatalf("control /run: %d %q %v", code, body, err)
	}
	marker.want(t, "control")

	var mu sync.Mutex
	sent, codes := map[string]int{}, map[int]int{}
	peak := fdsBefore
	report := func(stage string) {
		mu.Lock()
		defer mu.Unlock()
		r.set("%s; sent %s; answers %s; descriptors %d before, %d at peak so far", stage, countsLine(sent), codesLine(codes), fdsBefore, peak)
	}
	notePeak := func() {
		if f := countFDs(pid); f > peak {
			peak = f
		}
	}
	// answer checks one answer: a 4xx (or want) with a message.
	answer := func(class, what string, want int, code int, body string, err error) {
		t.Helper()
		mu.Lock()
		sent[class]++
		codes[code]++
		mu.Unlock()
		switch {
		case err != nil:
			t.Errorf("%s: %s: %v", class, what, err)
		case want != 0 && code != want:
			t.Errorf("%s: %s: %d %q, want %d", class, what, code, body, want)
		case want == 0 && (code < 400 || code > 499):
			t.Errorf("%s: %s: %d %q, want a 4xx", class, what, code, body)
		case strings.TrimSpace(body) == "":
			t.Errorf("%s: %s: %d with no message", class, what, code)
		}
	}

	// Idle clients: one request each on a kept-alive connection, then
	// nothing; the agent closes them after its idle timeout (90 s).
	idleDone := make(chan time.Duration, idleConns)
	for i := 0; i < idleConns; i++ {
		go func() {
			c, err := k.dial()
			if err != nil {
				idleDone <- -1
				return
			}
			defer c.Close()
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				idleDone <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			start := time.Now()
			c.SetReadDeadline(start.Add(3 * time.Minute))
			br.ReadByte()
			idleDone <- time.Since(start)
		}()
	}
	mu.Lock()
	sent["idle"] += idleConns
	mu.Unlock()

	// Slow clients: TLS then headers a byte every 300 ms, and TCP
	// connections that never start TLS; the server's 10 s limit on the
	// handshake and headers closes them while others are served.
	slowDone := make(chan error, slowConns+silentConns)
	for i := 0; i < slowConns; i++ {
		go func() { slowDone <- k.trickle(time.Minute) }()
	}
	for i := 0; i < silentConns; i++ {
		go func() { slowDone <- k.silent(time.Minute) }()
	}
	mu.Lock()
	sent["slow"] += slowConns
	sent["silent"] += silentConns
	mu.Unlock()
	for i := 0; i < 5; i++ {
		time.Sleep(time.Second)
		notePeak()
		code, body, err := k.do(k.req("GET", "/healthz"))
		if err != nil || code != 200 {
			t.Errorf("a client beside %d slow ones: %d %q %v", slowConns+silentConns, code, body, err)
		}
	}
	for i := 0; i < slowConns+silentConns; i++ {
		if err := <-slowDone; err != nil {
			t.Errorf("slow client: %v", err)
		}
	}
	report("slow clients closed")

	for round := 1; round <= rounds; round++ {
		badRequestRound(t, k, round, answer)
		notePeak()
		report(fmt.Sprintf("%d of %d rounds", round, rounds))
	}

	// The idle connections, closed in time.
	for i := 0; i < idleConns; i++ {
		d := <-idleDone
		if d < 0 || d > 2*time.Minute+30*time.Second {
			t.Errorf("idle connection: closed after %v, want about 90 s", d)
		}
	}

	// The descriptors the connections held are given back.
	var fdsAfter int
	within(60*time.Second).For(t, "the agent's descriptors back to where they were", func() (bool, string) {
		fdsAfter = countFDs(pid)
		return fdsAfter <= fdsBefore+5, fmt.Sprintf("%d descriptors, %d before", fdsAfter, fdsBefore)
	})
	var found []string
	problem := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		found = append(found, strings.SplitN(fmt.Sprintf(format, args...), ":", 2)[0])
	}
	if code, _, err := k.do(k.req("GET", "/healthz")); err != nil || code != 200 {
		problem("not serving after it all: /healthz %d %v", code, err)
	}
	if ran := marker.extra("control"); len(ran) > 0 {
		problem("commands ran: markers %v", ran)
	}
	if after := podFingerprint(mustStatus(t, n)); after != podsBefore {
		problem("pods changed:\nbefore %s\nafter  %s", podsBefore, after)
	}
	select {
	case <-n.done:
		t.Fatal("the agent exited")
	default:
	}
	n.stop()
	if log, _ := os.ReadFile(filepath.Join(n.dir, "agent.log")); strings.Contains(string(log), "panic") || strings.Contains(string(log), "goroutine ") {
		problem("a panic in the agent log")
	}
	if after := storeRecords(t, n); after != recordsBefore {
		problem("store records changed:\nbefore %s\nafter  %s", recordsBefore, after)
	}
	verdict := "0 crashes, 0 commands run, pod and store unchanged"
	if len(found) > 0 {
		verdict = "FOUND: " + strings.Join(found, "; ")
	}
	mu.Lock()
	r.set("%d rounds; sent %s; answers %s; descriptors %d before, %d at peak, %d after; %s",
		rounds, countsLine(sent), codesLine(codes), fdsBefore, peak, fdsAfter, verdict)
	mu.Unlock()
}

// badRequestRound sends one of each malformed request, with round in the
// markers its commands would leave.
func badRequestRound(t *testing.T, k kapi, round int, answer func(class, what string, want, code int, body string, err error)) {
	t.Helper()
	touch := func(name string) string {
		return "command=touch&command=" + url.QueryEscape(fmt.Sprintf("/marker/%s-%d", name, round)) + "&output=1&error=1"
	}
	get := func(class, path string, want int) {
		t.Helper()
		code, body, err := k.do(k.req("GET", path))
		answer(class, "GET "+path[:min(len(path), 80)], want, code, body, err)
	}
	// Bad paths.
	long := strings.Repeat("a", 8<<10)
	for _, c := range []struct {
		path string
		want int
	}{
		{"/containerLogs/default/nope/main", 404},
		{"/containerLogs/default/" + k.pod + "/nope", 404},
		{"/containerLogs/nope/" + k.pod + "/main", 404},
		{"/containerLogs/default/" + k.pod + "/main/extra", 404},
		{"/containerLogs/default/" + k.pod + "/../../../../etc/passwd", 400},
		{"/containerLogs/default/" + k.pod + "/..%2F..%2F..%2Fetc%2Fpasswd", 400},
		{"/containerLogs/default/" + k.pod + "/%2E%2E", 400},
		{"/containerLogs//target/main", 400},
		{"/containerLogs/default%2F" + k.pod + "/main", 404},
		{"/containerLogs/default/" + long + "/main", 404},
		{"/exec/default/" + k.pod + "/main", 400}, // no command
		{"/configz", 404},
		{"/runningpods/", 404},
		{"/logs/../../etc/passwd", 400},
		{"/pods/../../etc/passwd", 400},
		{"/%00", 404},
	} {
		get("path", c.path, c.want)
	}
	code, body, err := k.do(k.req("DELETE", "/pods"))
	answer("path", "DELETE /pods", 405, code, body, err)
	code, body, err = k.do(k.req("POST", "/run/default/"+k.pod+"/main"))
	answer("path", "POST /run without cmd", 400, code, body, err)
	code, body, err = k.do(k.req("POST", "/run/default/"+k.pod+"/nope?cmd=touch+/marker/run-"+fmt.Sprint(round)))
	answer("path", "POST /run to an unknown container", 404, code, body, err)

	// Bad query values.
	for _, q := range []string{"tailLines=-1", "tailLines=x", "sinceSeconds=abc", "sinceSeconds=0",
		"limitBytes=0", "limitBytes=99999999999999999999999", "sinceTime=yesterday", "follow=maybe",
		"previous=2", "sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z", "tailLines=%00"} {
		get("query", "/containerLogs/default/"+k.pod+"/main?"+q, 400)
	}
	get("query", "/portForward/default/"+k.pod+"?port=abc", 400)

	// Huge headers: a 100 KiB request line, one 100 KiB header, 2,000
	// small ones.
	big := strings.Repeat("x", 100<<10)
	code, body, err = k.do(k.req("GET", "/containerLogs/default/"+k.pod+"/main?tailLines="+big))
	answer("header", "100 KiB request line", 431, code, body, err)
	code, body, err = k.do(k.req("GET", "/healthz", "X-Big: "+big))
	answer("header", "100 KiB header", 431, code, body, err)
	var many []string
	for i := 0; i < 2000; i++ {
		many = append(many, fmt.Sprintf("X-H%d: %s", i, strings.Repeat("y", 40)))
	}
	code, body, err = k.do(k.req("GET", "/healthz", many...))
	answer("header", "2,000 headers", 431, code, body, err)

	// Invalid stream upgrades, each carrying a command that leaves a
	// marker.
	spdy := []string{"Connection: Upgrade", "Upgrade: SPDY/3.1"}
	ws := func(extra ...string) []string {
		return append([]string{"Connection: Upgrade", "Upgrade: websocket"}, extra...)
	}
	for _, c := range []struct {
		what, method, path string
		hdr                []string
	}{
		{"exec, Upgrade: bogus", "POST", "/exec/default/" + k.pod + "/main?" + touch("bogus"), []string{"Connection: Upgrade", "Upgrade: bogus/1.0", "X-Stream-Protocol-Version: v4.channel.k8s.io"}},
		{"exec, unknown subprotocol", "POST", "/exec/default/" + k.pod + "/main?" + touch("proto"), append(spdy, "X-Stream-Protocol-Version: v99.channel.example.com")},
		{"exec, no subprotocol", "POST", "/exec/default/" + k.pod + "/main?" + touch("noproto"), spdy},
		{"exec, no upgrade", "POST", "/exec/default/" + k.pod + "/main?" + touch("plain"), nil},
		{"exec, websocket version 7", "GET", "/exec/default/" + k.pod + "/main?" + touch("wsver"), ws("Sec-WebSocket-Version: 7", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol: v4.channel.k8s.io")},
		{"exec, websocket without a key", "GET", "/exec/default/" + k.pod + "/main?" + touch("wskey"), ws("Sec-WebSocket-Version: 13", "Sec-WebSocket-Protocol: v4.channel.k8s.io")},
		{"exec, websocket unknown subprotocol", "GET", "/exec/default/" + k.pod + "/main?" + touch("wsproto"), ws("Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol: nope.example.com")},
		{"attach, Upgrade: bogus", "POST", "/attach/default/" + k.pod + "/main?output=1", []string{"Connection: Upgrade", "Upgrade: bogus/1.0", "X-Stream-Protocol-Version: v4.channel.k8s.io"}},
		{"attach, unknown subprotocol", "POST", "/attach/default/" + k.pod + "/main?output=1", append(spdy, "X-Stream-Protocol-Version: v99.channel.example.com")},
		{"portForward, Upgrade: bogus", "POST", "/portForward/default/" + k.pod + "", []string{"Connection: Upgrade", "Upgrade: bogus/1.0", "X-Stream-Protocol-Version: portforward.k8s.io"}},
		{"portForward, unknown subprotocol", "POST", "/portForward/default/" + k.pod + "", append(spdy, "X-Stream-Protocol-Version: v99.example.com")},
		{"portForward, no upgrade", "GET", "/portForward/default/" + k.pod + "", nil},
	} {
		code, body, err := k.do(k.req(c.method, c.path, c.hdr...))
		if round == 1 {
			t.Logf("%s: %d %q", c.what, code, strings.TrimSpace(body))
		}
		answer("upgrade", c.what, 0, code, body, err)
	}
	// A good SPDY upgrade, then garbage, or nothing and a close: the
	// server gives up on the streams and nothing runs.
	for _, garbage := range []string{"\x80\x03\x00\x01garbage-frame-garbage-frame", ""} {
		what := "SPDY upgrade then garbage"
		if garbage == "" {
			what = "SPDY upgrade then close"
		}
		c, code, err := k.upgrade(k.req("POST", "/exec/default/"+k.pod+"/main?"+touch(fmt.Sprintf("garbage%d", len(garbage))), append(spdy, "X-Stream-Protocol-Version: v4.channel.k8s.io")...))
		answer("upgrade", what, 101, code, "switched", err)
		if c == nil {
			continue
		}
		if garbage == "" {
			c.Close()
			continue
		}
		io.WriteString(c, garbage)
		start := time.Now()
		c.SetReadDeadline(start.Add(90 * time.Second))
		_, err = io.Copy(io.Discard, c)
		if time.Since(start) > 75*time.Second {
			t.Errorf("%s: the connection stayed open %v (%v)", what, time.Since(start), err)
		}
		c.Close()
	}
}

// kapi is a client of a node's kubelet API that writes its requests as
// raw bytes, so it can send what no well-behaved client would.
type kapi struct {
	pod  string // the pod requests are about
	addr string
	tls  *tls.Config
}

// req is an HTTP/1.1 request with headers hdr, that closes its
// connection.
func (k kapi) req(method, path string, hdr ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: node\r\n", method, path)
	for _, h := range hdr {
		b.WriteString(h + "\r\n")
	}
	if !strings.Contains(strings.Join(hdr, "\n"), "Connection:") {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	return b.String()
}

func (k kapi) dial() (*tls.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", k.addr, k.tls)
}

// do sends req on a connection of its own and returns the answer's
// status and body (at most 64 KiB). The request is written while the
// answer is read: a server may answer before reading it all.
func (k kapi) do(req string) (int, string, error) {
	c, err := k.dial()
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	go io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// upgrade sends req and returns the connection when the answer is 101
// Switching Protocols.
func (k kapi) upgrade(req string) (net.Conn, int, error) {
	c, err := k.dial()
	if err != nil {
		return nil, 0, err
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, resp.StatusCode, nil
	}
	c.SetDeadline(time.Time{})
	return c, resp.StatusCode, nil
}

// trickle starts TLS, then sends a request's headers a byte every
// 300 ms; it returns nil once the server closed the connection, an error
// when it stays open for limit.
func (k kapi) trickle(limit time.Duration) error {
	c, err := k.dial()
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	closed := make(chan struct{})
	go func() {
		c.SetReadDeadline(time.Now().Add(limit))
		io.Copy(io.Discard, c)
		close(closed)
	}()
	start := time.Now()
	req := "GET /healthz HTTP/1.1\r\nHost: node\r\n" + strings.Repeat("X-Slow: 1\r\n", 1000)
	for i := 0; i < len(req); i++ {
		select {
		case <-closed:
			return nil
		case <-time.After(300 * time.Millisecond):
		}
		if _, err := c.Write([]byte{req[i]}); err != nil {
			return nil
		}
		if time.Since(start) > limit {
			break
		}
	}
	return fmt.Errorf("a client sending its headers a byte at a time still connected after %v", time.Since(start).Round(time.Second))
}

// silent opens a TCP connection and sends nothing; nil once the server
// closed it, an error when it stays open for limit.
func (k kapi) silent(limit time.Duration) error {
	c, err := net.DialTimeout("tcp", k.addr, 10*time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(limit))
	_, err = io.Copy(io.Discard, c)
	if time.Since(start) >= limit {
		return fmt.Errorf("a client that never started TLS still connected after %v (%v)", time.Since(start).Round(time.Second), err)
	}
	return nil
}

// markerDir is a directory pods mount (hostPath) at /marker: a command
// that ran leaves a file in it.
type markerDir struct{ dir string }

func newMarkerDir(t testing.TB, parent string) markerDir {
	t.Helper()
	d := filepath.Join(parent, "marker")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return markerDir{d}
}

// extra returns the files in the directory other than names.
func (m markerDir) extra(names ...string) []string {
	var out []string
	for e := range dirEntries(m.dir) {
		if !slices.Contains(names, e) {
			out = append(out, e)
		}
	}
	sort.Strings(out)
	return out
}

// want checks that the directory holds exactly names.
func (m markerDir) want(t testing.TB, names ...string) {
	t.Helper()
	var got []string
	for e := range dirEntries(m.dir) {
		got = append(got, e)
	}
	sort.Strings(got)
	sort.Strings(names)
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("markers left by commands: %v, want %v: a command ran that should not have", got, names)
	}
}

// podFingerprint is what a pod's containers are: their IDs and restart
// counts.
func podFingerprint(s agent.Status) string {
	var out []string
	for _, p := range s.Pods {
		line := p.Namespace + "/" + p.Name + " " + p.UID
		if p.Status != nil {
			for _, c := range p.Status.ContainerStatuses {
				line += fmt.Sprintf(" %s=%s/%d", c.Name, c.ContainerID, c.RestartCount)
			}
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// storeRecords reads the stopped node's store: its pods, services,
// config maps, secrets and IP allocations, as JSON.
func storeRecords(t testing.TB, n *node) string {
	t.Helper()
	st, err := store.Open(filepath.Join(n.dir, "state", store.FileName), store.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the store: %v", err)
	}
	defer st.Close()
	var parts []any
	add := func(v any, err error) {
		if err != nil {
			t.Fatalf("read the store: %v", err)
		}
		parts = append(parts, v)
	}
	add(st.Pods().List())
	add(st.Services().List())
	add(st.ConfigMaps().List())
	add(st.Secrets().List())
	add(st.Allocations())
	b, err := json.Marshal(parts)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// countFDs is how many descriptors process pid has open.
func countFDs(pid int) int { return len(dirEntries(fmt.Sprintf("/proc/%d/fd", pid))) }

func countsLine(m map[string]int) string {
	var out []string
	for _, k := range []string{"path", "query", "header", "upgrade", "slow", "silent", "idle"} {
		if m[k] > 0 {
			out = append(out, fmt.Sprintf("%d %s", m[k], k))
		}
	}
	return strings.Join(out, ", ")
}

func codesLine(m map[int]int) string {
	var keys []int
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%d×%d", m[k], k))
	}
	return strings.Join(out, " ")
}
