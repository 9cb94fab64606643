package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/internal/promtext"
	"github.com/outpost-edge/outpost/netproxy/nft"
	"github.com/outpost-edge/outpost/netproxy/nfttest"
	"github.com/outpost-edge/outpost/store"
)

// slow is a flaky Ruleset whose every Apply takes d of the fake clock.
type slow struct {
	*flaky
	clk *clocktest.Fake
	d   time.Duration
}

func (r *slow) Apply(tx *nft.Tx) error {
	r.clk.Advance(r.d)
	return r.flaky.Apply(tx)
}

func TestWriteMetrics(t *testing.T) {
	st := openStore(t)
	a, b := newPod("web-a", "web"), newPod("web-b", "web")
	put(t, st.Services(), store.SourceStatic, webService())
	ag := newAgent(true)
	ag.set(a, podAIP, true)
	clk := clocktest.New(time.Unix(1000, 0))
	rs := &slow{flaky: &flaky{Fake: nfttest.NewFake(), failAt: 2}, clk: clk, d: 30 * time.Millisecond}
	p := newProxy(t, Config{}, Deps{Store: st, Ruleset: rs, LocalPods: ag.LocalPods, Clock: clk})

	mustSync(t, p) // full
	ag.set(b, podBIP, true)
	if err := p.Sync(); err == nil { // partial, fails
		t.Fatal("the second sync did not fail")
	}
	mustSync(t, p) // full again, after the failure
	mustSync(t, p) // partial, nothing to apply

	s := p.Stats()
	var out strings.Builder
	w := promtext.New(&out)
	p.WriteMetrics(w)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`# HELP outpost_proxy_syncs_total Syncs of the service rules to nftables, by kind (full or partial) and result (success or error).
# TYPE outpost_proxy_syncs_total counter
outpost_proxy_syncs_total{kind="partial",result="success"} 1
outpost_proxy_syncs_total{kind="partial",result="error"} 1
outpost_proxy_syncs_total{kind="full",result="success"} 2
outpost_proxy_syncs_total{kind="full",result="error"} 0
# HELP outpost_proxy_sync_duration_seconds Time the syncs of the service rules took in seconds (reading the store, building the rules and applying them), by kind.
# TYPE outpost_proxy_sync_duration_seconds summary
outpost_proxy_sync_duration_seconds_sum{kind="partial"} 0.03
outpost_proxy_sync_duration_seconds_count{kind="partial"} 2
outpost_proxy_sync_duration_seconds_sum{kind="full"} 0.06
outpost_proxy_sync_duration_seconds_count{kind="full"} 2
# HELP outpost_proxy_last_sync_duration_seconds Time the last sync of the service rules took in seconds.
# TYPE outpost_proxy_last_sync_duration_seconds gauge
outpost_proxy_last_sync_duration_seconds 0
# HELP outpost_proxy_last_sync_timestamp_seconds When the last sync of the service rules ended, in seconds since the epoch; 0 before the first.
# TYPE outpost_proxy_last_sync_timestamp_seconds gauge
outpost_proxy_last_sync_timestamp_seconds 1000.09
# HELP outpost_proxy_last_sync_operations nftables operations the last sync applied (0 when it failed).
# TYPE outpost_proxy_last_sync_operations gauge
outpost_proxy_last_sync_operations 0
# HELP outpost_proxy_service_ports Service ports programmed, as of the last successful sync.
# TYPE outpost_proxy_service_ports gauge
outpost_proxy_service_ports 1
# HELP outpost_proxy_nftables_chains Chains in the outpost nftables table, as last applied.
# TYPE outpost_proxy_nftables_chains gauge
outpost_proxy_nftables_chains %d
# HELP outpost_proxy_nftables_rules Rules in the outpost nftables table, as last applied.
# TYPE outpost_proxy_nftables_rules gauge
outpost_proxy_nftables_rules %d
# HELP outpost_proxy_nftables_map_elements Verdict map elements in the outpost nftables table, as last applied.
# TYPE outpost_proxy_nftables_map_elements gauge
outpost_proxy_nftables_map_elements %d
`, s.Chains, s.Rules, s.Elements)
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if s.Chains == 0 || s.Rules == 0 || s.Elements == 0 {
		t.Errorf("empty table: %+v", s)
	}
}
