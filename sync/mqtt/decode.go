package mqtt

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Decoded is a payload as `outpost mqtt decode` shows it.
type Decoded struct {
	// Online is the online flag's value, for that topic's payload.
	Online string `json:"online,omitempty"`
	// Empty marks an empty payload: it deletes a retained message.
	Empty    bool           `json:"empty,omitempty"`
	Envelope *DecodedHeader `json:"envelope,omitempty"`
	// Object is the body decoded as its kind; Index the index's lines.
	Object any               `json:"object,omitempty"`
	Index  map[string]uint64 `json:"index,omitempty"`
}

// DecodedHeader is an envelope's header.
type DecodedHeader struct {
	Kind       string    `json:"kind"`
	Generation uint64    `json:"generation"`
	Encoding   string    `json:"encoding"`
	Issued     time.Time `json:"issued,omitzero"`
	BodyBytes  int       `json:"bodyBytes"`
	// SignedBy is the key id of the signature (the first 8 bytes of the
	// SHA-256 of the public key, in hex), not checked.
	SignedBy string `json:"signedBy,omitempty"`
}

// Decode reads any outpost payload: the online flag, an empty payload,
// or an envelope with its object.
func Decode(payload []byte) (Decoded, error) {
	switch string(payload) {
	case "":
		return Decoded{Empty: true}, nil
	case OnlineTrue, OnlineFalse:
		return Decoded{Online: string(payload)}, nil
	}
	e, err := UnmarshalEnvelope(payload)
	if err != nil {
		return Decoded{}, err
	}
	d := Decoded{Envelope: &DecodedHeader{Kind: e.Kind, Generation: e.Generation, Encoding: e.Encoding.String(), Issued: e.Issued, BodyBytes: len(e.Body)}}
	if len(e.Signature) == sigFieldLen {
		d.Envelope.SignedBy = KeyID(e.Signature[:keyIDLen]).String()
	}
	switch e.Encoding {
	case EncodingTombstone, EncodingSealed, EncodingFrame:
		return d, nil // a sealed body opens only on its node
	case EncodingIndex:
		x, err := ParseIndex(e, ScopeNode)
		if err != nil {
			x, err = ParseIndex(e, ScopeCluster)
		}
		if err != nil {
			return d, err
		}
		d.Index = x.Entries
		return d, nil
	}
	var obj interface{ Unmarshal([]byte) error }
	switch e.Kind {
	case "Pod":
		obj = &corev1.Pod{}
	case "ConfigMap":
		obj = &corev1.ConfigMap{}
	case "Secret":
		obj = &corev1.Secret{}
	case "Service":
		obj = &corev1.Service{}
	case "EndpointSlice":
		obj = &discoveryv1.EndpointSlice{}
	case "Node":
		obj = &corev1.Node{}
	case "Event":
		obj = &corev1.Event{}
	default:
		return d, fmt.Errorf("envelope: kind %s is not one outpost sends", e.Kind)
	}
	if err := obj.Unmarshal(e.Body); err != nil {
		return d, fmt.Errorf("%s body: %w", e.Kind, err)
	}
	d.Object = obj
	return d, nil
}
