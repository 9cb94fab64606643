package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		flags  map[string]string
		action string
		ok     bool
	}{
		{
			args:   []string{"-namespace", "ns", "-address", "/run/c.sock", "-publish-binary", "/usr/bin/containerd", "-id", "c1", "start"},
			flags:  map[string]string{"namespace": "ns", "address": "/run/c.sock", "publish-binary": "/usr/bin/containerd", "id": "c1"},
			action: "start", ok: true,
		},
		{
			args:   []string{"--namespace=ns", "-debug", "-id=c1", "delete"},
			flags:  map[string]string{"namespace": "ns", "debug": "true", "id": "c1"},
			action: "delete", ok: true,
		},
		{args: []string{"-namespace", "ns", "-id", "c1"}, flags: map[string]string{"namespace": "ns", "id": "c1"}, ok: false},
		{args: []string{"-unknown", "x", "start"}, ok: false},
		{args: []string{"-id"}, ok: false},
		{args: []string{"start", "extra"}, action: "start", flags: map[string]string{}, ok: false},
	} {
		flags, action, ok := parse(tc.args)
		if ok != tc.ok || (ok && (action != tc.action || !reflect.DeepEqual(flags, tc.flags))) {
			t.Errorf("parse(%q) = %v, %q, %v; want %v, %q, %v", tc.args, flags, action, ok, tc.flags, tc.action, tc.ok)
		}
	}
}

// shortDir is a temporary directory with a path short enough for a unix
// socket named by a SHA-256 (the test's own would be too long).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shim")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// listen serves a unix socket where the runc shim of group would, for
// a containerd at /run/c.sock and namespace ns.
func listen(t *testing.T, group string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(filepath.Join("/run/c.sock", "ns", group)))
	path := filepath.Join(socketDir, hex.EncodeToString(sum[:]))
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return path
}

// bundle makes the current directory a bundle whose spec carries
// annotations.
func bundle(t *testing.T, annotations string) {
	t.Helper()
	t.Chdir(t.TempDir())
	if err := os.WriteFile("config.json", []byte(`{"ociVersion":"1.0.2","annotations":`+annotations+`}`), 0o600); err != nil {
		t.Fatal(err)
	}
}

var startArgs = []string{"-namespace", "ns", "-address", "/run/c.sock", "-publish-binary", "/usr/bin/containerd", "-id", "c1", "start"}

func TestFastStartAnswersForTheGroupsRunningShim(t *testing.T) {
	socketDir = shortDir(t)
	path := listen(t, "outpost-2")
	bundle(t, `{"io.containerd.runc.v2.group":"outpost-2"}`)
	addr, ok := fastStart(startArgs)
	if !ok || addr != "unix://"+path {
		t.Fatalf("fastStart = %q, %v; want unix://%s, true", addr, ok, path)
	}
	got, err := os.ReadFile("address")
	if err != nil || string(got) != addr {
		t.Fatalf("address file = %q, %v; want %q", got, err, addr)
	}
	if _, err := os.Stat(".address"); !os.IsNotExist(err) {
		t.Errorf(".address left behind: %v", err)
	}
}

func TestFastStartGroupsByTheContainerIDWithoutAnnotation(t *testing.T) {
	socketDir = shortDir(t)
	path := listen(t, "c1")
	bundle(t, `{}`)
	if addr, ok := fastStart(startArgs); !ok || addr != "unix://"+path {
		t.Fatalf("fastStart = %q, %v; want unix://%s, true", addr, ok, path)
	}
}

func TestFastStartLeavesTheRestToTheRuncShim(t *testing.T) {
	socketDir = shortDir(t)
	listen(t, "outpost-1")
	for name, tc := range map[string]struct {
		annotations string
		args        []string
	}{
		"no shim for the group":   {`{"io.containerd.runc.v2.group":"outpost-2"}`, startArgs},
		"not a start":             {`{"io.containerd.runc.v2.group":"outpost-1"}`, append(append([]string{}, startArgs[:len(startArgs)-1]...), "delete")},
		"no namespace":            {`{"io.containerd.runc.v2.group":"outpost-1"}`, startArgs[2:]},
		"an unknown flag":         {`{"io.containerd.runc.v2.group":"outpost-1"}`, append([]string{"-new-flag"}, startArgs...)},
		"a spec it cannot decode": {`[`, startArgs},
	} {
		t.Run(name, func(t *testing.T) {
			bundle(t, tc.annotations)
			if addr, ok := fastStart(tc.args); ok {
				t.Fatalf("fastStart = %q, true; want it left to the runc shim", addr)
			}
			if _, err := os.Stat("address"); !os.IsNotExist(err) {
				t.Errorf("address written: %v", err)
			}
		})
	}
}

func TestFastStartWithoutBundle(t *testing.T) {
	socketDir = shortDir(t)
	listen(t, "c1")
	t.Chdir(t.TempDir())
	if _, ok := fastStart(startArgs); ok {
		t.Fatal("fastStart answered without a config.json")
	}
}
