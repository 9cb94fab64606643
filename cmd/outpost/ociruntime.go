package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// ociRuntime is the OCI runtime the pods' containers run on, when one is
// set (containerd.ociRuntime): its path and the runtime-spec version it
// implements.
type ociRuntime struct {
	path, specVersion string
}

// lookOCIRuntime finds the OCI runtime name (a program in PATH or an
// absolute path) and asks it which runtime-spec version it implements
// (the "spec:" line of its --version), for the containers' specs to
// declare: crun 1.8 refuses a spec of a version newer than its own.
// An empty name is runc, as the runc shim has it: nothing to look up.
func lookOCIRuntime(ctx context.Context, name string) (ociRuntime, error) {
	if name == "" {
		return ociRuntime{}, nil
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return ociRuntime{}, fmt.Errorf("containerd.ociRuntime: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return ociRuntime{}, fmt.Errorf("containerd.ociRuntime: %s --version: %w", path, err)
	}
	v, err := specVersion(out)
	if err != nil {
		return ociRuntime{}, fmt.Errorf("containerd.ociRuntime: %s --version: %w", path, err)
	}
	return ociRuntime{path: path, specVersion: v}, nil
}

// specVersion is the runtime-spec version in an OCI runtime's --version
// output: its "spec: 1.0.2-dev" line, as runc and crun print it.
func specVersion(out []byte) (string, error) {
	for line := range bytes.Lines(out) {
		v, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "spec:")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "" || strings.ContainsAny(v, " \t") || !strings.HasPrefix(v, "1.") {
			return "", fmt.Errorf("spec version %q is not one like 1.0.2", v)
		}
		return v, nil
	}
	return "", fmt.Errorf("no spec: line in %q", bytes.TrimSpace(out))
}
