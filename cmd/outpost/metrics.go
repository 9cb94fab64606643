package main

import (
	"runtime"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/procmetrics"
	"github.com/outpost-edge/outpost/internal/promtext"
	"github.com/outpost-edge/outpost/netproxy/proxy"
	"github.com/outpost-edge/outpost/store"
)

// metricsWriter returns what fills the agent's /metrics: the build, the
// agent's pods, the store, the API sync, the service proxy, the board's
// sensors and the process. Each of a, st, ks and ms (standalone), px
// (--record-only) and health may be nil; its families are then left out.
// health is called once per scrape.
func metricsWriter(a *agent.Agent, st *store.Store, ks *kubeSync, ms *mqttSync, px *proxy.Proxy, health func() arm.Readings) func(p *promtext.Writer) {
	return func(p *promtext.Writer) {
		p.Family("outpost_build_info", "The outpost build: its version and the Go version it was built with.", promtext.Gauge)
		p.Sample("outpost_build_info", 1, "version", version, "goversion", runtime.Version())
		if a != nil {
			a.WriteMetrics(p)
		}
		if st != nil {
			st.WriteMetrics(p)
		}
		if ks != nil && ks.Syncer != nil {
			ks.WriteMetrics(p)
		}
		if ms != nil {
			ms.WriteMetrics(p)
		}
		if px != nil {
			px.WriteMetrics(p)
		}
		if health != nil {
			writeBoardMetrics(p, arm.Metrics(health()))
		}
		procmetrics.Write(p)
	}
}

// boardHelp is the HELP text of the families arm.Metrics makes.
var boardHelp = map[string]string{
	arm.MetricTemperature:       "Temperature of each thermal zone in degrees Celsius.",
	arm.MetricThrottleFlag:      "The Raspberry Pi firmware's throttling flags (get_throttled), 1 when set: now, or occurred since boot.",
	arm.MetricUnderVoltageAlarm: "The rpi_volt hwmon's under-voltage alarm: 1 when the supply voltage was too low in the last 2 seconds.",
}

// writeBoardMetrics writes arm's samples as gauge families, each family's
// samples together in the order the family first appears.
func writeBoardMetrics(p *promtext.Writer, samples []arm.Sample) {
	var names []string
	byName := map[string][]arm.Sample{}
	for _, s := range samples {
		if _, ok := byName[s.Name]; !ok {
			names = append(names, s.Name)
		}
		byName[s.Name] = append(byName[s.Name], s)
	}
	for _, name := range names {
		help, ok := boardHelp[name]
		if !ok {
			help = "A board sensor reading."
		}
		p.Family(name, help, promtext.Gauge)
		for _, s := range byName[name] {
			labels := make([]string, 0, 2*len(s.Labels))
			for _, l := range s.Labels {
				labels = append(labels, l.Name, l.Value)
			}
			p.Sample(name, s.Value, labels...)
		}
	}
}
