package proxy

import (
	"time"

	"github.com/outpost-edge/outpost/internal/promtext"
)

// syncCounts are the syncs since start by kind (partial or full) and
// result, and their total time by kind. Proxy.mu guards them.
type syncCounts struct {
	n   [2][2]uint64     // [full][failed]
	sum [2]time.Duration // [full]
}

func (c *syncCounts) add(full bool, d time.Duration, err error) {
	k := index(full)
	c.n[k][index(err != nil)]++
	c.sum[k] += d
}

func index(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WriteMetrics writes the service proxy's families: its syncs by kind
// (full: the whole table rewritten; partial: only what changed) and
// result, their time, what the last sync did, and what the table holds
// as last applied.
func (p *Proxy) WriteMetrics(w *promtext.Writer) {
	p.mu.Lock()
	st, c := p.stats, p.counts
	p.mu.Unlock()
	kinds := [2]string{"partial", "full"}
	w.Family("outpost_proxy_syncs_total", "Syncs of the service rules to nftables, by kind (full or partial) and result (success or error).", promtext.Counter)
	for k, kind := range kinds {
		for f, result := range [2]string{"success", "error"} {
			w.Sample("outpost_proxy_syncs_total", float64(c.n[k][f]), "kind", kind, "result", result)
		}
	}
	w.Family("outpost_proxy_sync_duration_seconds", "Time the syncs of the service rules took in seconds (reading the store, building the rules and applying them), by kind.", promtext.Summary)
	for k, kind := range kinds {
		w.Sample("outpost_proxy_sync_duration_seconds_sum", c.sum[k].Seconds(), "kind", kind)
		w.Sample("outpost_proxy_sync_duration_seconds_count", float64(c.n[k][0]+c.n[k][1]), "kind", kind)
	}
	w.Family("outpost_proxy_last_sync_duration_seconds", "Time the last sync of the service rules took in seconds.", promtext.Gauge)
	w.Sample("outpost_proxy_last_sync_duration_seconds", st.LastDuration.Seconds())
	var last float64
	if !st.Last.IsZero() {
		last = float64(st.Last.UnixNano()) / 1e9
	}
	w.Family("outpost_proxy_last_sync_timestamp_seconds", "When the last sync of the service rules ended, in seconds since the epoch; 0 before the first.", promtext.Gauge)
	w.Sample("outpost_proxy_last_sync_timestamp_seconds", last)
	w.Family("outpost_proxy_last_sync_operations", "nftables operations the last sync applied (0 when it failed).", promtext.Gauge)
	w.Sample("outpost_proxy_last_sync_operations", float64(st.LastOps))
	for _, g := range []struct {
		name, help string
		v          int
	}{
		{"outpost_proxy_service_ports", "Service ports programmed, as of the last successful sync.", st.Services},
		{"outpost_proxy_nftables_chains", "Chains in the outpost nftables table, as last applied.", st.Chains},
		{"outpost_proxy_nftables_rules", "Rules in the outpost nftables table, as last applied.", st.Rules},
		{"outpost_proxy_nftables_map_elements", "Verdict map elements in the outpost nftables table, as last applied.", st.Elements},
	} {
		w.Family(g.name, g.help, promtext.Gauge)
		w.Sample(g.name, float64(g.v))
	}
}
