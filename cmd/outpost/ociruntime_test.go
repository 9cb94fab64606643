package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSpecVersion(t *testing.T) {
	tests := []struct{ out, want, err string }{
		{"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n", "1.0.2-dev", ""},
		{"crun version 1.8.1\ncommit: f8a096be\nrundir: /run/crun\nspec: 1.0.0\n+SYSTEMD +SELINUX +CAP\n", "1.0.0", ""},
		{"crun version 1.8.1\n", "", `no spec: line in "crun version 1.8.1"`},
		{"spec: two words\n", "", `spec version "two words" is not one like 1.0.2`},
		{"spec:\n", "", `spec version "" is not`},
	}
	for _, tt := range tests {
		got, err := specVersion([]byte(tt.out))
		if got != tt.want || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("specVersion(%q) = %q, %v; want %q, %q", tt.out, got, err, tt.want, tt.err)
		}
	}
}

func TestLookOCIRuntime(t *testing.T) {
	dir := t.TempDir()
	rt := filepath.Join(dir, "fakerun")
	if err := os.WriteFile(rt, []byte("#!/bin/sh\necho 'fakerun version 0.1'\necho 'spec: 1.0.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	got, err := lookOCIRuntime(context.Background(), "fakerun")
	if err != nil || got != (ociRuntime{path: rt, specVersion: "1.0.1"}) {
		t.Errorf("lookOCIRuntime(fakerun) = %+v, %v", got, err)
	}
	if got, err := lookOCIRuntime(context.Background(), ""); err != nil || got != (ociRuntime{}) {
		t.Errorf("lookOCIRuntime(\"\") = %+v, %v; want runc's zero value", got, err)
	}
	_, err = lookOCIRuntime(context.Background(), "nosuchrun")
	if err == nil || !strings.HasPrefix(err.Error(), "containerd.ociRuntime: ") || !strings.Contains(err.Error(), "nosuchrun") {
		t.Errorf("lookOCIRuntime(nosuchrun) err = %v, want one naming the setting and the program", err)
	}
}
