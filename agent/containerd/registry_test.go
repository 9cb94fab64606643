package containerd

import "testing"

func TestRegistryHostsPlainHTTPOnlyOnLoopback(t *testing.T) {
	hosts := registryHosts()
	for _, tc := range []struct {
		host, scheme string
	}{
		{"127.0.0.1:5000", "http"},
		{"localhost:5000", "http"},
		{"localhost", "http"},
		{"[::1]:5000", "http"},
		{"192.0.2.1:5000", "https"},
		{"192.0.2.1", "https"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			got, err := hosts(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Scheme != tc.scheme || got[0].Path != "/v2" || got[0].Authorizer == nil {
				t.Fatalf("hosts(%q) = %+v, want one %s host at /v2 with an authorizer", tc.host, got, tc.scheme)
			}
		})
	}
}
