package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
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

// recorded records out as what the runc shim's start printed for the
// shim on socket, in a recordDir of the test's.
func recorded(t *testing.T, socket, out string) {
	t.Helper()
	if err := record(filepath.Join(recordDir, filepath.Base(socket)), []byte(out)); err != nil {
		t.Fatal(err)
	}
}

// useDirs points socketDir and recordDir at directories of the test's.
func useDirs(t *testing.T) {
	t.Helper()
	socketDir, recordDir = shortDir(t), t.TempDir()
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
	useDirs(t)
	path := listen(t, "outpost-2")
	recorded(t, path, "unix://"+path)
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

// containerd 2.x's runc shim prints a JSON, and serves only the version
// of the task API it names: containerd takes a bare address for version
// 2, which that shim does not serve.
func TestFastStartRepeatsTheRecordedJSON(t *testing.T) {
	useDirs(t)
	path := listen(t, "outpost-2")
	params := `{"version":3,"address":"unix://` + path + `","protocol":"ttrpc"}`
	recorded(t, path, params)
	bundle(t, `{"io.containerd.runc.v2.group":"outpost-2"}`)
	if out, ok := fastStart(startArgs); !ok || out != params {
		t.Fatalf("fastStart = %q, %v; want %s, true", out, ok, params)
	}
	if got, err := os.ReadFile("address"); err != nil || string(got) != "unix://"+path {
		t.Fatalf("address file = %q, %v; want unix://%s", got, err, path)
	}
}

func TestFastStartGroupsByTheContainerIDWithoutAnnotation(t *testing.T) {
	useDirs(t)
	path := listen(t, "c1")
	recorded(t, path, "unix://"+path)
	bundle(t, `{}`)
	if addr, ok := fastStart(startArgs); !ok || addr != "unix://"+path {
		t.Fatalf("fastStart = %q, %v; want unix://%s, true", addr, ok, path)
	}
}

func TestFastStartLeavesTheRestToTheRuncShim(t *testing.T) {
	useDirs(t)
	path := listen(t, "outpost-1")
	recorded(t, path, "unix://"+path)
	listen(t, "outpost-3")
	other := listen(t, "outpost-4")
	recorded(t, other, "unix://"+path)
	for name, tc := range map[string]struct {
		annotations string
		args        []string
	}{
		"no shim for the group":   {`{"io.containerd.runc.v2.group":"outpost-2"}`, startArgs},
		"a shim not recorded":     {`{"io.containerd.runc.v2.group":"outpost-3"}`, startArgs},
		"a record of another":     {`{"io.containerd.runc.v2.group":"outpost-4"}`, startArgs},
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
	useDirs(t)
	recorded(t, listen(t, "c1"), "unix://"+filepath.Join(socketDir, "x"))
	t.Chdir(t.TempDir())
	if _, ok := fastStart(startArgs); ok {
		t.Fatal("fastStart answered without a config.json")
	}
}

func TestStartAndRecordKeepsWhatTheRuncShimPrinted(t *testing.T) {
	useDirs(t)
	path := listen(t, "outpost-2")
	other := filepath.Join(socketDir, "other")
	params := `{"version":3,"address":"unix://` + path + `","protocol":"ttrpc"}`
	for name, tc := range map[string]struct {
		out    string
		code   int
		record bool
	}{
		"a JSON":                   {params, 0, true},
		"an address":               {"unix://" + path, 0, true},
		"a failed start":           {"unix://" + path, 3, false},
		"the address of another":   {"unix://" + other, 0, false},
		"nothing the shim printed": {"", 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			rec := filepath.Join(recordDir, filepath.Base(path))
			os.Remove(rec)
			var stdout bytes.Buffer
			shim, _ := fakeRuncShim(t, "", tc.out, tc.code)
			if code := startAndRecord(&stdout, strings.NewReader(""), shim, startArgs, path); code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			if stdout.String() != tc.out {
				t.Errorf("printed %q, want %q", stdout.String(), tc.out)
			}
			got, err := os.ReadFile(rec)
			switch {
			case tc.record && (err != nil || string(got) != tc.out):
				t.Errorf("record = %q, %v; want %q", got, err, tc.out)
			case !tc.record && !os.IsNotExist(err):
				t.Errorf("recorded %q, %v; want no record", got, err)
			}
		})
	}
	// What the next start of the group prints; the record of a shim
	// whose socket is gone goes.
	gone := filepath.Join(socketDir, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	recorded(t, gone, "unix://"+gone)
	shim, _ := fakeRuncShim(t, "", params, 0)
	startAndRecord(new(bytes.Buffer), strings.NewReader(""), shim, startArgs, path)
	if _, err := os.Stat(filepath.Join(recordDir, filepath.Base(gone))); !os.IsNotExist(err) {
		t.Errorf("the record of a shim whose socket is gone stays: %v", err)
	}
	bundle(t, `{"io.containerd.runc.v2.group":"outpost-2"}`)
	if out, ok := fastStart(startArgs); !ok || out != params {
		t.Fatalf("fastStart after the recorded start = %q, %v; want %s, true", out, ok, params)
	}
}
