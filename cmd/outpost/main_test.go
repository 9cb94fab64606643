package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/internal/waittest"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outpost dev", "commit: ", "go: go1.", "platform: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestConfigCheckBadFieldIsAConfigError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("network:\n  podCIDR: 10.0.0.0/33\n"), 0o644)
	var out bytes.Buffer
	err := run(context.Background(), []string{"config", "check", "--config", path}, &out, &out)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error (exit 2)", err)
	}
	if want := path + `: network.podCIDR: "10.0.0.0/33" is not a CIDR`; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
}

func TestConfigCheckPrintsEffectiveConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("nodeName: pi-9\n"), 0o644)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "--config", path}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nodeName: pi-9", "podCIDR: 10.42.0.0/24", "namespace: outpost"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUnknownSubcommandAndFlagAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"status", "--bogus"}, {"status", "-o", "xml"}, {}} {
		var out bytes.Buffer
		var ue usageError
		if err := run(context.Background(), args, &out, &out); !errors.As(err, &ue) {
			t.Errorf("%q: err = %v, want a usage error (exit 2)", args, err)
		}
	}
}

// TestAgentAndStatus runs the agent subcommand on a temp state dir, reads
// status from it over the socket, stops it, and reads status again from
// the store file alone.
func TestAgentAndStatus(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	os.Mkdir(manifests, 0o755)
	os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, image: 'outpost.test/busybox:1.35'}]}\n"), 0o644)
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("nodeName: test-node\nstateDir: "+filepath.Join(dir, "state")+"\nmanifestDir: "+manifests+"\nlog: {level: error}\n"), 0o644)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"agent", "--record-only", "--config", cfgPath}, os.Stdout, os.Stderr)
	}()

	status := func() agent.Status {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), []string{"status", "--config", cfgPath, "-o", "json"}, &out, &out); err != nil {
			t.Fatalf("status: %v", err)
		}
		var s agent.Status
		if err := json.Unmarshal(out.Bytes(), &s); err != nil {
			t.Fatalf("status json: %v\n%s", err, out.String())
		}
		return s
	}
	// Wait (bounded) for the agent to answer with the recorded pod.
	var s agent.Status
	waittest.Poll{Timeout: 10 * time.Second, Every: 20 * time.Millisecond}.For(t, "the agent to report the pod", func() (bool, string) {
		var out bytes.Buffer
		err := run(context.Background(), []string{"status", "--config", cfgPath, "-o", "json"}, &out, &out)
		if err == nil {
			json.Unmarshal(out.Bytes(), &s)
			if s.From == "agent" && len(s.Pods) == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%v %+v", err, s)
	})
	if s.Pods[0].Name != "web-test-node" || s.Pods[0].Source != "static" {
		t.Fatalf("pods = %+v", s.Pods)
	}
	var table bytes.Buffer
	if err := run(context.Background(), []string{"status", "--config", cfgPath}, &table, &table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"read from the running agent", "web-test-node", "static", "PHASE"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	s = status()
	if s.From != "store" || len(s.Pods) != 1 || s.Node != "test-node" {
		t.Fatalf("status from store = %+v", s)
	}
}

// `outpost bridge keygen` writes a private key for its owner alone and
// never over a file, and prints the public key `outpost bridge pubkey`
// prints for the same file.
func TestBridgeKeygen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signing.key")
	var gen, pub bytes.Buffer
	if err := run(context.Background(), []string{"bridge", "keygen", path}, &gen, &gen); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	if err := run(context.Background(), []string{"bridge", "pubkey", path}, &pub, &pub); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(gen.String(), "ed25519:") || gen.String() != pub.String() {
		t.Errorf("keygen printed %q, pubkey %q", gen.String(), pub.String())
	}
	if _, err := mqtt.ParsePublicKey(strings.TrimSpace(gen.String())); err != nil {
		t.Error(err)
	}
	if err := run(context.Background(), []string{"bridge", "keygen", path}, &gen, &gen); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("keygen over an existing file: %v", err)
	}
	var ue usageError
	if err := run(context.Background(), []string{"bridge", "keygen"}, &gen, &gen); !errors.As(err, &ue) {
		t.Errorf("keygen without a file: %v, want a usage error", err)
	}
}
