// Package report holds the states the node's parts report about
// themselves for `outpost status`: the link to the API server or the
// MQTT broker, the node's certificates, and the service proxy's syncs.
// sync/kube, sync/mqtt and netproxy/proxy fill them and agent shows them
// (its Status, as JSON); it imports only the standard library, so all
// of them can share one type per fact.
package report

import "time"

// Link is the state of the node's connection to the API server or to the
// MQTT broker.
type Link struct {
	// Transport is "mqtt" for a node synced through an MQTT broker,
	// empty for the API server.
	Transport string `json:"transport,omitempty"`
	// Server is the API server's URL, or the MQTT broker's.
	Server string `json:"server"`
	// Connected reports whether the last Lease renewal succeeded (for
	// MQTT: whether the broker connection is up).
	Connected bool `json:"connected"`
	// Since is when Connected last changed (or the sync started).
	Since time.Time `json:"since"`
	// LastLease is when the Lease was last renewed.
	LastLease time.Time `json:"lastLease,omitzero"`
	// LastPublish is when the MQTT broker last acknowledged a status.
	LastPublish time.Time `json:"lastPublish,omitzero"`
	// LastError is the newest failed request, and when it failed.
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// MirrorErrors names the static pods that have no mirror pod in the
	// API, and why.
	MirrorErrors []string `json:"mirrorErrors,omitempty"`
	// Certificate is the node's client certificate when bootstrapping.
	Certificate *Cert `json:"certificate,omitempty"`
}

// CertPhase is where one of the node's certificates stands.
type CertPhase string

const (
	// CertValid: a certificate is in use and not yet due for renewal.
	CertValid CertPhase = "valid"
	// CertRequesting: a certificate is being requested (see CSR), for the
	// first time or as a renewal.
	CertRequesting CertPhase = "requesting"
	// CertDenied: the request was denied or its signing failed; it is
	// checked again with backoff, and a new one is made once it is gone.
	CertDenied CertPhase = "denied"
	// CertFailing: the request could not be made or followed (the API
	// server is unreachable or refuses the credential); retried with
	// backoff.
	CertFailing CertPhase = "failing"
)

// Cert is one of the node's certificates: the client certificate it
// bootstraps, or the serving certificate of its kubelet API.
type Cert struct {
	Phase CertPhase `json:"phase"`
	// Usable reports whether a certificate that has not expired is in
	// use. When it is false for the client certificate the API server
	// sync cannot work; for the serving certificate the kubelet API
	// serves its self-signed one.
	Usable bool `json:"usable"`
	// Subject, NotAfter and RenewAt describe the certificate in use.
	Subject  string    `json:"subject,omitempty"`
	NotAfter time.Time `json:"notAfter,omitzero"`
	RenewAt  time.Time `json:"renewAt,omitzero"`
	// CSR names the newest certificate signing request.
	CSR string `json:"csr,omitempty"`
	// Reason says what the phase waits for or why it failed.
	Reason string `json:"reason,omitempty"`
	// Since is when Phase or Reason last changed.
	Since time.Time `json:"since"`
}

// Proxy is what the service proxy's syncs did.
type Proxy struct {
	// Syncs and Failures count the syncs since start.
	Syncs    int `json:"syncs"`
	Failures int `json:"failures"`
	// Last is when the last sync ended, LastDuration how long it took,
	// LastOps the nftables operations it applied, LastError its error
	// (empty on success).
	Last         time.Time     `json:"last,omitzero"`
	LastDuration time.Duration `json:"lastDuration"`
	LastOps      int           `json:"lastOps"`
	LastError    string        `json:"lastError,omitempty"`
	// Services is the number of service ports programmed; Chains, Rules
	// and Elements count the outpost table.
	Services int `json:"services"`
	Chains   int `json:"chains"`
	Rules    int `json:"rules"`
	Elements int `json:"elements"`
}
