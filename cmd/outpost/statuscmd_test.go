package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/report"
)

// An invalid pod shows as Failed in the table, and with its reason and the
// bad field when shown alone.
func TestStatusShowsInvalidPodReasonAndMessage(t *testing.T) {
	p := agent.PodInfo{
		Namespace: "default", Name: "bad-n1", UID: "u1", Source: "static", Containers: 1,
		Status: &corev1.PodStatus{Phase: corev1.PodFailed, Reason: agent.ReasonInvalidPod, Message: "spec.containers[0].image: is required (line 9)"},
	}
	var table bytes.Buffer
	if err := printStatus(&table, agent.Status{Node: "n1", From: "store", Pods: []agent.PodInfo{p}}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^default +bad-n1 +static +Failed +0/1 `).Match(table.Bytes()) {
		t.Fatalf("table:\n%s", table.String())
	}
	var one bytes.Buffer
	if err := printPod(&one, p); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`(?m)^STATUS +Failed$`, `(?m)^REASON +InvalidPod$`, `(?m)^MESSAGE +spec\.containers\[0\]\.image: is required \(line 9\)$`} {
		if !regexp.MustCompile(want).Match(one.Bytes()) {
			t.Errorf("pod lacks %s:\n%s", want, one.String())
		}
	}
}

// The BOARD line shows the model with the decoded revision, the hottest
// zone, the throttling flags and how to turn the memory controller on.
func TestStatusBoardLine(t *testing.T) {
	throttle := func(v arm.Throttle) *arm.Throttle { return &v }
	yes := true
	pi4 := &arm.Revision{Code: "c03114", NewStyle: true, Type: "4B", Revision: "1.4", MemoryMB: 4096, Processor: "BCM2711", Manufacturer: "Sony UK"}
	for _, tc := range []struct {
		name  string
		board arm.Facts
		want  string
	}{
		{"pi4, fine", arm.Facts{
			Model: "Raspberry Pi 4 Model B Rev 1.4", PiRevision: pi4, Cgroup: arm.CgroupV2, MemoryCgroup: true,
			Health: arm.Readings{Zones: []arm.Zone{{Name: "thermal_zone0", Type: "cpu-thermal", MilliC: 48312}}, Throttle: throttle(0)},
		}, "Raspberry Pi 4 Model B Rev 1.4 (4B rev 1.4, 4 GB, c03114), cgroup v2, 48.3 °C (cpu-thermal), no under-voltage or throttling, memory controller on"},
		{"pi3bplus, under-voltage, memory off", arm.Facts{
			Model: "Raspberry Pi 3 Model B Plus Rev 1.3", Cgroup: arm.CgroupHybrid, BootCmdline: arm.CmdlineBoot,
			PiRevision: &arm.Revision{Code: "a020d3", NewStyle: true, Type: "3B+", Revision: "1.3", MemoryMB: 1024},
			Health:     arm.Readings{Throttle: throttle(0x70005), UnderVoltageAlarm: &yes},
		}, "Raspberry Pi 3 Model B Plus Rev 1.3 (3B+ rev 1.3, 1 GB, a020d3), cgroup hybrid, under-voltage now, throttled now, arm-frequency-capped occurred, " +
			"memory controller off: add cgroup_enable=memory cgroup_memory=1 to the single line of /boot/cmdline.txt, then reboot"},
		{"other board", arm.Facts{
			Model: "Radxa ROCK Pi 4B", Cgroup: arm.CgroupV2, MemoryCgroup: true,
			Health: arm.Readings{Zones: []arm.Zone{{Name: "thermal_zone0", Type: "soc-thermal", MilliC: 42222}, {Name: "thermal_zone1", Type: "gpu-thermal", MilliC: 45000}}},
		}, "Radxa ROCK Pi 4B, cgroup v2, 45.0 °C (gpu-thermal), memory controller on"},
		{"nothing known", arm.Facts{Cgroup: arm.CgroupV1, MemoryCgroup: true}, "unknown model, cgroup v1, memory controller on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			s := agent.Status{Node: "n1", From: "agent", Agent: &agent.AgentInfo{Version: "test", Board: tc.board}}
			if err := printStatus(&out, s); err != nil {
				t.Fatal(err)
			}
			want := "BOARD    " + tc.want
			var got string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "BOARD") {
					got = strings.TrimRight(l, " ")
				}
			}
			if got != want {
				t.Errorf("got  %q\nwant %q\n%s", got, want, out.String())
			}
		})
	}
}

// The PROXY line says what the proxy programmed and how its last sync
// went; the services table shows cluster IPs and node ports.
func TestStatusProxyLineAndServices(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ok := &report.Proxy{Syncs: 3, Last: now.Add(-2 * time.Second), LastDuration: 1234567 * time.Nanosecond, Services: 2, Chains: 9, Rules: 14, Elements: 3}
	if got, want := proxyLine(ok, now), "2 service ports: 9 chains, 14 rules, 3 map elements; synced 2s ago in 1.23ms"; got != want {
		t.Errorf("proxyLine = %q, want %q", got, want)
	}
	failed := *ok
	failed.LastError = "sync table outpost: apply: no such file or directory"
	if got := proxyLine(&failed, now); !strings.HasSuffix(got, "; last sync failed 2s ago: sync table outpost: apply: no such file or directory") {
		t.Errorf("proxyLine = %q, want the error", got)
	}
	if got := proxyLine(&report.Proxy{}, now); got != "not synced yet" {
		t.Errorf("proxyLine before a sync = %q", got)
	}
	var out bytes.Buffer
	s := agent.Status{Node: "n1", From: "agent", Agent: &agent.AgentInfo{Proxy: ok},
		Services: []agent.ServiceRow{{Namespace: "default", Name: "web", Source: "static", Type: "NodePort", ClusterIP: "10.43.0.81", Ports: "80:30080/TCP"}}}
	if err := printStatus(&out, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`(?m)^PROXY +2 service ports`, `(?m)^default +web +static +NodePort +10\.43\.0\.81 +80:30080/TCP$`} {
		if !regexp.MustCompile(want).Match(out.Bytes()) {
			t.Errorf("status lacks %s:\n%s", want, out.String())
		}
	}
}

// A store that takes no writes gets a block saying why and since when; a
// writable one, or an agent too old to say, none.
func TestStatusStoreTakesNoWrites(t *testing.T) {
	since := time.Date(2026, 12, 5, 1, 2, 3, 0, time.UTC)
	for _, tc := range []struct {
		name string
		w    agent.StoreWrites
		want string
	}{
		{"full", agent.StoreWrites{Reason: "NoSpace", Message: "the file system of /var/lib/outpost is full (less than 1 MiB free)", Since: since},
			"STORE TAKES NO WRITES (NoSpace, since 2026-12-05T01:02:03Z): pods keep running; what changes is kept in memory and written when the disk takes writes again\n  the file system of /var/lib/outpost is full (less than 1 MiB free)\n"},
		{"writable", agent.StoreWrites{Writable: true, Since: since}, ""},
		{"older agent", agent.StoreWrites{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printStatus(&out, agent.Status{Node: "n1", From: "agent", Agent: &agent.AgentInfo{StoreWrites: tc.w}}); err != nil {
				t.Fatal(err)
			}
			got := strings.Contains(out.String(), "STORE TAKES NO WRITES")
			if tc.want == "" && got || tc.want != "" && !strings.Contains(out.String(), "\n"+tc.want) {
				t.Errorf("status:\n%s\nwant the block %q", out.String(), tc.want)
			}
		})
	}
}
