package report

import (
	"encoding/json"
	"testing"
	"time"
)

// The JSON is what `outpost status -o json` prints under agent.link and
// agent.proxy, which scripts read: its field names must not change.
func TestJSONFieldNames(t *testing.T) {
	ts := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"link", Link{
			Transport: "mqtt", Server: "s", Connected: true, Since: ts, LastLease: ts, LastPublish: ts, LastError: "e", LastErrorAt: ts, MirrorErrors: []string{"m"},
			Certificate: &Cert{Phase: CertValid, Usable: true, Subject: "sub", NotAfter: ts, RenewAt: ts, CSR: "csr", Reason: "r", Since: ts},
		}, `{"transport":"mqtt","server":"s","connected":true,"since":"2026-12-04T12:00:00Z","lastLease":"2026-12-04T12:00:00Z","lastPublish":"2026-12-04T12:00:00Z","lastError":"e","lastErrorAt":"2026-12-04T12:00:00Z","mirrorErrors":["m"],"certificate":{"phase":"valid","usable":true,"subject":"sub","notAfter":"2026-12-04T12:00:00Z","renewAt":"2026-12-04T12:00:00Z","csr":"csr","reason":"r","since":"2026-12-04T12:00:00Z"}}`},
		{"empty link", Link{Certificate: &Cert{}},
			`{"server":"","connected":false,"since":"0001-01-01T00:00:00Z","certificate":{"phase":"","usable":false,"since":"0001-01-01T00:00:00Z"}}`},
		{"proxy", Proxy{Syncs: 1, Failures: 2, Last: ts, LastDuration: 3, LastOps: 4, LastError: "e", Services: 5, Chains: 6, Rules: 7, Elements: 8},
			`{"syncs":1,"failures":2,"last":"2026-12-04T12:00:00Z","lastDuration":3,"lastOps":4,"lastError":"e","services":5,"chains":6,"rules":7,"elements":8}`},
		{"empty proxy", Proxy{},
			`{"syncs":0,"failures":0,"lastDuration":0,"lastOps":0,"services":0,"chains":0,"rules":0,"elements":0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}
