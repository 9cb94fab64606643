package mqtt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Envelope is the header around every outpost MQTT payload but the online
// flag. On the wire:
//
//	"op" 0x01                       magic and format version
//	TAG LEN VALUE …                 header fields: a tag byte, a uvarint
//	                                length, the value
//	0x00                            end of the header
//	BODY                            the rest: the object's protobuf
//
// Tags: 1 kind (text, "Pod"), 2 generation (uvarint), 3 encoding (one
// byte), 4 issued (uvarint, Unix milliseconds), 5 signature (sign.go;
// always the last field). A reader skips a tag it
// does not know unless the tag's high bit is set, which marks a field it
// must understand: such an envelope is refused.
type Envelope struct {
	// Kind is the Kubernetes kind of the body: Pod, ConfigMap, Secret,
	// Service, EndpointSlice, Node, Event, or Index.
	Kind string
	// Generation orders the messages of one topic: a desired object's
	// resourceVersion in the API server, a status's journal sequence
	// number, an index's resourceVersion.
	Generation uint64
	// Encoding says what Body holds.
	Encoding Encoding
	// Issued is when the sender made the envelope; zero when unknown.
	Issued time.Time
	// Body is the object: its Kubernetes protobuf message (as in
	// k8s.io/api's generated.proto, without the "k8s\x00" wrapper, the
	// kind is in the header), or an index's lines; empty for a
	// tombstone.
	Body []byte
	// Signature is the signature field's value (sign.go), if any: a key
	// id and an ed25519 signature. Marshal writes it as it is; a Signer
	// makes it.
	Signature []byte
	// sigAt and sigEnd are where the signature field starts and ends in
	// the payload it was read from.
	sigAt, sigEnd int
}

// Encoding says how an envelope's body is encoded.
type Encoding uint8

// The encodings.
const (
	// EncodingProtobuf is the Kubernetes protobuf message of Kind.
	EncodingProtobuf Encoding = 1
	// EncodingTombstone means the object was deleted at Generation; the
	// body is empty.
	EncodingTombstone Encoding = 2
	// EncodingIndex is an index's text (index.go).
	EncodingIndex Encoding = 3
	// EncodingSealed is the protobuf message of Kind (a Secret) sealed
	// to the node's seal key (seal.go).
	EncodingSealed Encoding = 4
	// EncodingFrame is a tunnel frame (sync/mqtt/tunnel) of a kubelet
	// API stream, Kind "Frame" (rpc.go).
	EncodingFrame Encoding = 5
)

// String names the encoding as docs/mqtt.md and `outpost mqtt decode` do.
func (e Encoding) String() string {
	switch e {
	case EncodingProtobuf:
		return "protobuf"
	case EncodingTombstone:
		return "tombstone"
	case EncodingIndex:
		return "index"
	case EncodingSealed:
		return "sealed"
	case EncodingFrame:
		return "frame"
	}
	return fmt.Sprintf("encoding(%d)", uint8(e))
}

const (
	envelopeVersion = 1
	tagEnd          = 0
	tagKind         = 1
	tagGeneration   = 2
	tagEncoding     = 3
	tagIssued       = 4
	tagCritical     = 0x80
	maxKindLen      = 64
)

var envelopeMagic = [3]byte{'o', 'p', envelopeVersion}

// Marshal lays out e as it goes on the wire.
func (e Envelope) Marshal() []byte {
	return e.appendRest(e.marshalHeader(sigFieldLen+2), e.Signature)
}

// appendRest appends the signature field (if sig is not empty), the end
// of the header and the body to a header from marshalHeader.
func (e Envelope) appendRest(out, sig []byte) []byte {
	if len(sig) > 0 {
		out = append(out, tagSignature)
		out = binary.AppendUvarint(out, uint64(len(sig)))
		out = append(out, sig...)
	}
	out = append(out, tagEnd)
	return append(out, e.Body...)
}

// marshalHeader lays out the magic and every header field but the
// signature, with room for extra bytes and the body after them.
func (e Envelope) marshalHeader(extra int) []byte {
	out := make([]byte, 0, 32+len(e.Kind)+extra+len(e.Body))
	out = append(out, envelopeMagic[:]...)
	field := func(tag byte, v []byte) {
		out = append(out, tag)
		out = binary.AppendUvarint(out, uint64(len(v)))
		out = append(out, v...)
	}
	field(tagKind, []byte(e.Kind))
	field(tagGeneration, binary.AppendUvarint(nil, e.Generation))
	field(tagEncoding, []byte{byte(e.Encoding)})
	if !e.Issued.IsZero() && e.Issued.UnixMilli() > 0 {
		field(tagIssued, binary.AppendUvarint(nil, uint64(e.Issued.UnixMilli())))
	}
	return out
}

// UnmarshalEnvelope reads an envelope. The body aliases data.
func UnmarshalEnvelope(data []byte) (Envelope, error) {
	var e Envelope
	if len(data) < len(envelopeMagic) || data[0] != envelopeMagic[0] || data[1] != envelopeMagic[1] {
		return e, errors.New("envelope: not an outpost envelope (no \"op\" magic)")
	}
	if data[2] != envelopeVersion {
		return e, fmt.Errorf("envelope: format version %d, this outpost reads %d", data[2], envelopeVersion)
	}
	rest := data[len(envelopeMagic):]
	var haveKind, haveGen, haveEnc bool
	for {
		if len(rest) == 0 {
			return e, errors.New("envelope: header has no end")
		}
		at := len(data) - len(rest)
		tag := rest[0]
		rest = rest[1:]
		if tag == tagEnd {
			break
		}
		if e.sigAt > 0 {
			return e, errors.New("envelope: signature: not the last header field")
		}
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return e, fmt.Errorf("envelope: field %d: length runs past the end", tag)
		}
		v := rest[k : k+int(n)]
		rest = rest[k+int(n):]
		switch tag {
		case tagKind:
			if len(v) == 0 || len(v) > maxKindLen {
				return e, fmt.Errorf("envelope: kind: %d bytes long, want 1 to %d", len(v), maxKindLen)
			}
			e.Kind, haveKind = string(v), true
		case tagGeneration:
			g, err := uvarintField(v)
			if err != nil {
				return e, fmt.Errorf("envelope: generation: %w", err)
			}
			e.Generation, haveGen = g, true
		case tagEncoding:
			if len(v) != 1 {
				return e, fmt.Errorf("envelope: encoding: %d bytes, want 1", len(v))
			}
			e.Encoding, haveEnc = Encoding(v[0]), true
			switch e.Encoding {
			case EncodingProtobuf, EncodingTombstone, EncodingIndex, EncodingSealed, EncodingFrame:
			default:
				return e, fmt.Errorf("envelope: encoding %d is not one this outpost reads", v[0])
			}
		case tagSignature:
			if len(v) != sigFieldLen {
				return e, fmt.Errorf("envelope: signature: %d bytes, want %d", len(v), sigFieldLen)
			}
			e.Signature, e.sigAt, e.sigEnd = v, at, len(data)-len(rest)
		case tagIssued:
			ms, err := uvarintField(v)
			if err != nil || ms > 1<<53 {
				return e, fmt.Errorf("envelope: issued: not a time in Unix milliseconds")
			}
			e.Issued = time.UnixMilli(int64(ms)).UTC()
		default:
			if tag&tagCritical != 0 {
				return e, fmt.Errorf("envelope: field %d must be understood, and this outpost does not know it", tag)
			}
		}
	}
	switch {
	case !haveKind:
		return e, errors.New("envelope: no kind")
	case !haveGen:
		return e, errors.New("envelope: no generation")
	case !haveEnc:
		return e, errors.New("envelope: no encoding")
	case e.Encoding == EncodingTombstone && len(rest) > 0:
		return e, fmt.Errorf("envelope: a tombstone with a body of %d bytes", len(rest))
	}
	e.Body = rest
	return e, nil
}

// uvarintField reads a field that holds exactly one uvarint.
func uvarintField(v []byte) (uint64, error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || k != len(v) {
		return 0, errors.New("not one uvarint")
	}
	return n, nil
}
