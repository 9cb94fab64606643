package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/report"
)

// A kubeconfig the agent cannot use stops it with exit status 2 before it
// touches containerd, naming the file and what is wrong.
func TestAgentBadKubeconfigIsAUsageError(t *testing.T) {
	tests := []struct{ name, kubeconfig, want string }{
		{"not yaml", "clusters: [\n", "yaml: line 1"},
		{"no server", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
`, "no server found for cluster"},
		{"unknown context", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: other
`, `context was not found for specified context: other`},
		{"missing file", "", "no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			kc := filepath.Join(dir, "kubeconfig")
			if tt.kubeconfig != "" {
				os.WriteFile(kc, []byte(tt.kubeconfig), 0o600)
			}
			cfg := filepath.Join(dir, "config.yaml")
			os.WriteFile(cfg, fmt.Appendf(nil, "nodeName: n1\nstateDir: %s\nkubeconfig: %s\ncontainerd: {address: %s}\n", filepath.Join(dir, "state"), kc, filepath.Join(dir, "none.sock")), 0o644)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, []string{"agent", "--config", cfg}, &out, &out)
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want a usage error (exit 2)", err)
			}
			if !strings.Contains(err.Error(), "kubeconfig "+kc+": ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want the file and %q", err, tt.want)
			}
		})
	}
}

func TestStatusLinkLine(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	since := now.Add(-time.Hour)
	tests := []struct {
		name    string
		link    *report.Link
		backlog int
		want    string
	}{
		{"standalone", nil, 0, "standalone (no kubeconfig, no mqtt)"},
		{"connected", &report.Link{Server: "https://api:6443", Connected: true, Since: since, LastLease: now.Add(-3 * time.Second)}, 0,
			"connected to https://api:6443 since 2026-11-30T11:00:00Z, lease renewed 3s ago"},
		{"offline", &report.Link{Server: "https://api:6443", Since: since, LastLease: since, LastError: "dial tcp: connection refused", LastErrorAt: now.Add(-2 * time.Second)}, 7,
			"https://api:6443 offline since 2026-11-30T11:00:00Z, lease renewed 1h0m0s ago, 7 statuses to send; last error 2s ago: dial tcp: connection refused"},
		{"old error hidden once connected", &report.Link{Server: "s", Connected: true, Since: since, LastError: "old", LastErrorAt: since.Add(-time.Minute)}, 0,
			"connected to s since 2026-11-30T11:00:00Z"},
	}
	for _, tt := range tests {
		if got := linkLine(tt.link, tt.backlog, now); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}

// The board's sensor readings become node conditions: under-voltage now
// is UnderVoltage True with what to do; a cool zone is HighTemperature
// False; with nothing read there are none.
func TestBoardConditions(t *testing.T) {
	throttle := arm.Throttle(0x1) // under-voltage now
	got := boardConditions(arm.Readings{
		Throttle: &throttle,
		Zones:    []arm.Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 51000}},
	})
	byType := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range got {
		byType[c.Type] = c
	}
	if c := byType[arm.ConditionUnderVoltage]; c.Status != corev1.ConditionTrue || c.Reason != "UnderVoltageNow" || !strings.Contains(c.Message, "power supply") {
		t.Errorf("UnderVoltage = %+v", c)
	}
	if c := byType[arm.ConditionHighTemperature]; c.Status != corev1.ConditionFalse || c.Reason != "TemperatureNormal" {
		t.Errorf("HighTemperature = %+v", c)
	}
	if c, ok := byType[arm.ConditionThrottled]; !ok || c.Status != corev1.ConditionFalse {
		t.Errorf("Throttled = %+v, %v", c, ok)
	}
	if got := boardConditions(arm.Readings{}); len(got) != 0 {
		t.Errorf("no readings: %+v, want no conditions", got)
	}
}
