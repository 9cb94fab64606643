// Package promtext writes the Prometheus text exposition format (version
// 0.0.4): families with HELP and TYPE lines, then samples with escaped
// label values. It is what the agent's /metrics endpoints need without the
// Prometheus client library and its registry.
package promtext

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"strings"
)

// ContentType is the Content-Type of the text format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Type is a metric family's type.
type Type string

// Family types.
const (
	Counter Type = "counter"
	Gauge   Type = "gauge"
	Summary Type = "summary"
	Untyped Type = "untyped"
)

// Writer writes families to an io.Writer. Errors are sticky: after the
// first failed write the rest do nothing, and Flush returns it.
type Writer struct {
	w   *bufio.Writer
	err error
}

// New returns a Writer on w.
func New(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Family starts a family: its HELP and TYPE lines. Every sample of the
// family must follow before the next Family call.
func (p *Writer) Family(name, help string, t Type) {
	p.str("# HELP ")
	p.str(name)
	p.str(" ")
	p.str(escapeHelp(help))
	p.str("\n# TYPE ")
	p.str(name)
	p.str(" ")
	p.str(string(t))
	p.str("\n")
}

// Sample writes one sample. labels alternate names and values
// ("pod", "web", "namespace", "default"); an odd trailing name is ignored.
func (p *Writer) Sample(name string, value float64, labels ...string) {
	p.sample(name, value, 0, labels)
}

// SampleAt writes one sample with a timestamp in milliseconds since the
// epoch, as /metrics/resource gives its samples.
func (p *Writer) SampleAt(name string, value float64, ms int64, labels ...string) {
	p.sample(name, value, ms, labels)
}

func (p *Writer) sample(name string, value float64, ms int64, labels []string) {
	p.str(name)
	if len(labels) >= 2 {
		p.str("{")
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				p.str(",")
			}
			p.str(labels[i])
			p.str(`="`)
			p.str(escapeLabel(labels[i+1]))
			p.str(`"`)
		}
		p.str("}")
	}
	p.str(" ")
	p.str(formatFloat(value))
	if ms != 0 {
		p.str(" ")
		p.str(strconv.FormatInt(ms, 10))
	}
	p.str("\n")
}

// Flush writes what is buffered and returns the first error seen.
func (p *Writer) Flush() error {
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

func (p *Writer) str(s string) {
	if p.err == nil {
		_, p.err = p.w.WriteString(s)
	}
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }
