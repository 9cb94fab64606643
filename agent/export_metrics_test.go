package agent

import "github.com/outpost-edge/outpost/internal/promtext"

// WriteMetrics is writeMetrics.
func (m *podManager) WriteMetrics(p *promtext.Writer) { m.writeMetrics(p) }
