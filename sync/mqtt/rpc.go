package mqtt

import (
	"context"
	"errors"
	"fmt"
)

// The kubelet API of a node reached only over MQTT: the bridge serves it
// for the API server and carries each request's bytes to the node as a
// stream of tunnel frames (sync/mqtt/tunnel), on RPCDownTopic, with the
// node's answers on RPCUpTopic. Each frame is the body of an envelope of
// kind Frame, signed by the bridge when it has a signing key: a node
// with mqtt.trustedKeys takes only frames signed for its own down topic.

// KindFrame is the envelope kind of a tunnel frame.
const KindFrame = "Frame"

// Tunnel is the node's end of the streams (tunnel.Listener).
type Tunnel interface {
	// Handle takes a frame the bridge sent; it must not block.
	Handle(frame []byte)
	// Reset ends every open stream: the connection they used is gone.
	Reset(err error)
}

// FrameEnvelope is the envelope of a tunnel frame.
func FrameEnvelope(frame []byte) Envelope {
	return Envelope{Kind: KindFrame, Encoding: EncodingFrame, Body: frame}
}

// OpenFrame returns the tunnel frame in payload, which came on topic;
// with keys, only a frame signed for topic by one of them.
func OpenFrame(keys *Keyring, topic string, payload []byte) ([]byte, error) {
	e, err := UnmarshalEnvelope(payload)
	if err != nil {
		return nil, err
	}
	if e.Kind != KindFrame || e.Encoding != EncodingFrame {
		return nil, fmt.Errorf("envelope of kind %q, encoding %s: not a tunnel frame", e.Kind, e.Encoding)
	}
	if keys != nil {
		if _, err := keys.Verify(topic, payload, e); err != nil {
			return nil, err
		}
	}
	return e.Body, nil
}

// errNoLink is PublishFrame's error while the node has no connection.
var errNoLink = errors.New("mqtt: not connected to the broker")

// rpc hands a frame from the bridge to the tunnel, on paho's goroutine:
// frames do not wait behind the desired state in the inbox.
func (s *Syncer) rpc(m Message) {
	if m.Ack != nil {
		defer m.Ack()
	}
	if s.deps.Tunnel == nil {
		return
	}
	s.m.in("rpc", len(m.Payload))
	frame, err := OpenFrame(s.keys, m.Topic, m.Payload)
	if err != nil {
		reason := rejectEnvelope
		if errors.Is(err, ErrUnsigned) || errors.Is(err, ErrUnknownKey) || errors.Is(err, ErrBadSignature) {
			reason = rejectSig
		}
		s.m.reject(reason, "rpc")
		s.log.Warn("mqtt: tunnel frame refused", "topic", m.Topic, "err", err)
		return
	}
	s.deps.Tunnel.Handle(frame)
}

// PublishFrame sends a tunnel frame to the bridge on the current
// connection; without one it fails at once.
func (s *Syncer) PublishFrame(ctx context.Context, frame []byte) error {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn == nil {
		return errNoLink
	}
	payload := FrameEnvelope(frame).Marshal()
	if err := s.request(ctx, func(ctx context.Context) error {
		return conn.Publish(ctx, RPCUpTopic(s.cfg.NodeName), false, payload)
	}); err != nil {
		return err
	}
	s.m.out("rpc", len(payload))
	return nil
}
