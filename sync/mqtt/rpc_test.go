package mqtt

import (
	"bytes"
	"errors"
	"testing"
)

// TestOpenFrame: a node that trusts keys takes a tunnel frame only when
// it is signed by one of them for its own down topic; without keys it
// takes any frame, and never another kind of envelope.
func TestOpenFrame(t *testing.T) {
	bridge, other := testSigner(t), testSigner(t)
	keys := NewKeyring(bridge.Public())
	topic := RPCDownTopic("pi-1")
	frame := []byte("frame bytes")
	signed := bridge.Seal(topic, FrameEnvelope(frame))
	if got, err := OpenFrame(keys, topic, signed); err != nil || !bytes.Equal(got, frame) {
		t.Errorf("signed frame: %q, %v", got, err)
	}
	for name, c := range map[string]struct {
		topic   string
		payload []byte
		want    error
	}{
		"unsigned":          {topic, FrameEnvelope(frame).Marshal(), ErrUnsigned},
		"another key":       {topic, other.Seal(topic, FrameEnvelope(frame)), ErrUnknownKey},
		"another node":      {RPCDownTopic("pi-2"), signed, ErrBadSignature},
		"changed in flight": {topic, append(bytes.Clone(signed[:len(signed)-1]), signed[len(signed)-1]^1), ErrBadSignature},
	} {
		if _, err := OpenFrame(keys, c.topic, c.payload); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if got, err := OpenFrame(nil, topic, FrameEnvelope(frame).Marshal()); err != nil || !bytes.Equal(got, frame) {
		t.Errorf("no keys, unsigned frame: %q, %v", got, err)
	}
	pod := bridge.Seal(topic, Envelope{Kind: "Pod", Encoding: EncodingProtobuf, Body: frame})
	if _, err := OpenFrame(keys, topic, pod); err == nil {
		t.Error("a Pod envelope was taken as a tunnel frame")
	}
}
