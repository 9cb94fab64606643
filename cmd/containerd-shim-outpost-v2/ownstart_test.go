package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// runcOptions is what containerd writes to a start's stdin for opts.
func runcOptions(t *testing.T, opts *runcoptions.Options) []byte {
	t.Helper()
	v, err := proto.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&anypb.Any{TypeUrl: "containerd.runc.v1.Options", Value: v})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestShimCgroup(t *testing.T) {
	other, _ := proto.Marshal(&anypb.Any{TypeUrl: "io.containerd.other.Options", Value: []byte{0x1a, 1, 'x'}})
	for name, tc := range map[string]struct {
		data []byte
		cg   string
		ok   bool
	}{
		"no options":           {nil, "", true},
		"the binary alone":     {runcOptions(t, &runcoptions.Options{BinaryName: "crun", SystemdCgroup: true, IoUid: 7}), "", true},
		"a shim cgroup":        {runcOptions(t, &runcoptions.Options{BinaryName: "crun", ShimCgroup: "/shims"}), "/shims", true},
		"another type":         {other, "", false},
		"not protobuf":         {[]byte("{\"x\":1}"), "", false},
		"a truncated message":  {runcOptions(t, &runcoptions.Options{ShimCgroup: "/shims"})[:10], "", false},
		"an unknown wire type": {[]byte{0x0f, 1}, "", false},
	} {
		cg, ok := shimCgroup(tc.data)
		if cg != tc.cg || ok != tc.ok {
			t.Errorf("%s: shimCgroup = %q, %v; want %q, %v", name, cg, ok, tc.cg, tc.ok)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"/usr/bin/containerd-shim-runc-v2:\n  Version:  1.6.20~ds1\n  Revision: 1.6.20~ds1-1+deb12u3\n  Go version: go1.19.8\n\n": "1.6.20~ds1",
		"containerd-shim-runc-v2:\n  Version:  v2.3.7\n  Revision: \n":                                                            "2.3.7",
		"usage: containerd-shim-runc-v2\n": "",
	} {
		if got := parseVersion([]byte(out)); got != want {
			t.Errorf("parseVersion(%q) = %q, want %q", out, got, want)
		}
	}
}

// fakeRuncShim writes a script standing for a runc shim of version:
// asked -v, it says its version and counts the question in DIR/asked; as
// a start, it prints answer and exits with code; as a daemon, it writes
// its arguments, GOMAXPROCS, what its file descriptor 3 is and its OOM
// score to DIR/daemon, then waits a little.
func fakeRuncShim(t *testing.T, version, answer string, code int) (path, dir string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "containerd-shim-runc-v2")
	script := fmt.Sprintf(`#!/bin/sh
case "$1" in
-v) echo x >> %[1]s/asked; printf 'containerd-shim-runc-v2:\n  Version:  %[2]s\n'; exit 0;;
esac
for a; do last=$a; done
if [ "$last" = start ]; then printf '%%s' '%[3]s'; exit %[4]d; fi
{ echo "$*"; echo "GOMAXPROCS=$GOMAXPROCS"; readlink /proc/self/fd/3; cat /proc/self/oom_score_adj; } > %[1]s/daemon.tmp
mv %[1]s/daemon.tmp %[1]s/daemon
sleep 1
`, dir, version, answer, code)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, dir
}

// daemonSaw waits for the fake runc shim's daemon's report.
func daemonSaw(t *testing.T, dir string) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(dir, "daemon")); err == nil {
			return strings.Split(strings.TrimSpace(string(b)), "\n")
		}
	}
	t.Fatal("the shim daemon did not start")
	return nil
}

func TestShimVersionAsksOncePerBinary(t *testing.T) {
	recordDir = t.TempDir()
	path, dir := fakeRuncShim(t, "1.7.24~ds1", "", 0)
	for range 3 {
		if v := shimVersion(path); v != "1.7.24~ds1" {
			t.Fatalf("shimVersion = %q, want 1.7.24~ds1", v)
		}
	}
	asked := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "asked"))
		return bytes.Count(b, []byte("x"))
	}
	if n := asked(); n != 1 {
		t.Fatalf("asked %d times, want once", n)
	}
	// Another binary at the same path: an upgrade.
	path2, _ := fakeRuncShim(t, "2.3.7", "", 0)
	b, _ := os.ReadFile(path2)
	if err := os.WriteFile(path+".new", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if v := shimVersion(path); v != "2.3.7" {
		t.Fatalf("shimVersion after an upgrade = %q, want 2.3.7", v)
	}
}

func TestStartStartsTheShimOf16ItselfWithOneP(t *testing.T) {
	useDirs(t)
	bundle(t, `{"io.containerd.runc.v2.group":"outpost-1"}`)
	path, dir := fakeRuncShim(t, "1.6.20~ds1", "unix:///wrong", 0)
	socket, _ := startSocket(startArgs)
	var out bytes.Buffer
	if code := start(&out, bytes.NewReader(runcOptions(t, &runcoptions.Options{BinaryName: "crun"})), path, startArgs, socket); code != 0 {
		t.Fatalf("start exit code %d", code)
	}
	addr := "unix://" + socket
	if out.String() != addr {
		t.Errorf("start printed %q, want %q", out.String(), addr)
	}
	saw := daemonSaw(t, dir)
	if want := "-namespace ns -id c1 -address /run/c.sock"; saw[0] != want {
		t.Errorf("daemon arguments %q, want %q", saw[0], want)
	}
	if saw[1] != "GOMAXPROCS=1" {
		t.Errorf("daemon %s, want GOMAXPROCS=1", saw[1])
	}
	if !strings.HasPrefix(saw[2], "socket:") {
		t.Errorf("daemon's file descriptor 3 is %q, want a socket", saw[2])
	}
	parent, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", os.Getppid()))
	if p, _ := strconv.Atoi(strings.TrimSpace(string(parent))); saw[3] != strconv.Itoa(min(p+1, 1000)) {
		t.Errorf("daemon's OOM score %s, want its starter's parent's (%d) + 1", saw[3], p)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s: %v, %v; want a socket of mode 0600", socket, fi, err)
	}
	if b, err := os.ReadFile("address"); err != nil || string(b) != addr {
		t.Errorf("address file %q, %v; want %q", b, err, addr)
	}
	// The record answers the group's next start, while the shim listens.
	l, err := net.FileListener(mustOpenSocket(t, socket))
	if err == nil {
		defer l.Close()
	}
	if got, ok := fastStart(startArgs); !ok || got != addr {
		t.Errorf("next fastStart = %q, %v; want %q, true", got, ok, addr)
	}
}

// mustOpenSocket returns a listening socket on path, which ownStart made
// and a real shim would serve: the fake exits.
func mustOpenSocket(t *testing.T, path string) *os.File {
	t.Helper()
	os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStartLeavesOtherShimsTheirOwnStart(t *testing.T) {
	for name, tc := range map[string]struct {
		version string
		opts    *runcoptions.Options
	}{
		"containerd 2's shim": {"2.3.7", nil},
		"a shim cgroup":       {"1.6.20~ds1", &runcoptions.Options{ShimCgroup: "/shims"}},
		"a shim not saying":   {"", nil},
	} {
		t.Run(name, func(t *testing.T) {
			useDirs(t)
			bundle(t, `{"io.containerd.runc.v2.group":"outpost-1"}`)
			socket, _ := startSocket(startArgs)
			answer := `{"version":3,"address":"unix://` + socket + `","protocol":"ttrpc"}`
			path, dir := fakeRuncShim(t, tc.version, answer, 0)
			var opts []byte
			if tc.opts != nil {
				opts = runcOptions(t, tc.opts)
			}
			var out bytes.Buffer
			if code := start(&out, bytes.NewReader(opts), path, startArgs, socket); code != 0 {
				t.Fatalf("start exit code %d", code)
			}
			if out.String() != answer {
				t.Errorf("start printed %q, want the runc shim's %q", out.String(), answer)
			}
			if _, err := os.Stat(filepath.Join(dir, "daemon")); !os.IsNotExist(err) {
				t.Errorf("a daemon was started: %v", err)
			}
		})
	}
}

func TestOwnStartAnswersForARunningShim(t *testing.T) {
	useDirs(t)
	bundle(t, `{}`)
	socket := listen(t, "c1")
	path, dir := fakeRuncShim(t, "1.6.20~ds1", "", 0)
	flags, _, _ := parse(startArgs)
	addr, err := ownStart(path, flags, socket)
	if err != nil || addr != "unix://"+socket {
		t.Fatalf("ownStart = %q, %v; want unix://%s", addr, err, socket)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(dir, "daemon")); !os.IsNotExist(err) {
		t.Errorf("a second daemon was started: %v", err)
	}
}

func TestOwnStartReplacesADeadShimsSocket(t *testing.T) {
	useDirs(t)
	bundle(t, `{}`)
	socket, _ := startSocket(startArgs)
	if err := os.WriteFile(socket, nil, 0o600); err != nil { // left by a shim killed
		t.Fatal(err)
	}
	path, dir := fakeRuncShim(t, "1.6.20~ds1", "", 0)
	flags, _, _ := parse(startArgs)
	if _, err := ownStart(path, flags, socket); err != nil {
		t.Fatalf("ownStart over a dead shim's socket: %v", err)
	}
	daemonSaw(t, dir)
}
