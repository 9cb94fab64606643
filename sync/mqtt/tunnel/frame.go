package tunnel

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// Version is the frame format's version, the first byte of every frame.
const Version = 1

// Kind is what a frame does.
type Kind uint8

// The kinds of frames.
const (
	// KindOpen asks the node for a stream; Ack is the dialer's window.
	KindOpen Kind = 1 + iota
	// KindAccept takes a stream; Nonce is the listener's for it, Ack
	// its window.
	KindAccept
	// KindData carries the stream's next bytes.
	KindData
	// KindAck returns credit: Ack is the bytes the sender's reader has
	// consumed in all.
	KindAck
	// KindFin ends the sender's direction; it may still read.
	KindFin
	// KindClose ends the stream, or refuses an open; Payload is the
	// reason, empty for a clean close.
	KindClose
)

var kindNames = [...]string{KindOpen: "open", KindAccept: "accept", KindData: "data", KindAck: "ack", KindFin: "fin", KindClose: "close"}

// String returns the kind's name, such as "data".
func (k Kind) String() string {
	if k >= KindOpen && k <= KindClose {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// SessionID names a stream; the dialer makes it at random.
type SessionID [16]byte

// String returns the ID in hex.
func (id SessionID) String() string { return hex.EncodeToString(id[:]) }

// short is the ID's first 4 bytes in hex, enough to tell streams apart
// in errors and logs.
func (id SessionID) short() string { return hex.EncodeToString(id[:4]) }

// Frame is one message of the protocol (see the package documentation
// for the layout).
type Frame struct {
	Kind    Kind
	Session SessionID
	// Nonce is the listener's number for the stream: 0 in an open and
	// in a close that refuses one.
	Nonce uint64
	// Seq numbers data and fin frames 1, 2, 3… in each direction; a
	// close carries the number of the last one its sender sent.
	Seq uint64
	// Ack is the sender's window in open and accept frames, and in
	// data, fin and ack frames the bytes its reader consumed in all.
	Ack uint64
	// Payload is a data frame's bytes or a close's reason.
	Payload []byte
}

// fixedHeader is the length of the header's fixed part: version, kind,
// session and nonce.
const fixedHeader = 1 + 1 + len(SessionID{}) + 8

// maxHeader is the most bytes a frame's header takes.
const maxHeader = fixedHeader + 2*binary.MaxVarintLen64

// Append appends the frame's encoding to b.
func (f Frame) Append(b []byte) []byte {
	b = append(b, Version, byte(f.Kind))
	b = append(b, f.Session[:]...)
	b = binary.BigEndian.AppendUint64(b, f.Nonce)
	b = binary.AppendUvarint(b, f.Seq)
	b = binary.AppendUvarint(b, f.Ack)
	return append(b, f.Payload...)
}

// DecodeFrame decodes a frame. The frame's Payload is part of b. What
// decodes is well formed: a known version and kind, minimal varints, a
// sequence number only on data, fin and close frames (from 1 on data and
// fin), and a payload only on data and close frames.
func DecodeFrame(b []byte) (Frame, error) {
	if len(b) < fixedHeader+2 {
		return Frame{}, fmt.Errorf("tunnel: frame of %d bytes: shorter than a header", len(b))
	}
	if b[0] != Version {
		return Frame{}, fmt.Errorf("tunnel: frame of version %d: want %d", b[0], Version)
	}
	f := Frame{Kind: Kind(b[1])}
	if f.Kind < KindOpen || f.Kind > KindClose {
		return Frame{}, fmt.Errorf("tunnel: frame of unknown kind %d", b[1])
	}
	copy(f.Session[:], b[2:])
	f.Nonce = binary.BigEndian.Uint64(b[2+len(f.Session):])
	rest := b[fixedHeader:]
	var err error
	if f.Seq, rest, err = uvarint(rest); err != nil {
		return Frame{}, fmt.Errorf("tunnel: %s frame: seq: %w", f.Kind, err)
	}
	if f.Ack, rest, err = uvarint(rest); err != nil {
		return Frame{}, fmt.Errorf("tunnel: %s frame: ack: %w", f.Kind, err)
	}
	if len(rest) > 0 {
		f.Payload = rest
	}
	switch f.Kind {
	case KindData, KindFin:
		if f.Seq == 0 {
			return Frame{}, fmt.Errorf("tunnel: %s frame: seq 0", f.Kind)
		}
	case KindOpen, KindAccept, KindAck:
		if f.Seq != 0 {
			return Frame{}, fmt.Errorf("tunnel: %s frame: seq %d, want 0", f.Kind, f.Seq)
		}
	}
	if len(f.Payload) > 0 && f.Kind != KindData && f.Kind != KindClose {
		return Frame{}, fmt.Errorf("tunnel: %s frame: %d bytes of payload, want none", f.Kind, len(f.Payload))
	}
	return f, nil
}

// uvarint reads a minimally encoded uvarint from b and returns the rest.
func uvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, nil, errors.New("truncated")
	case n < 0:
		return 0, nil, errors.New("overflows 64 bits")
	case n > 1 && b[n-1] == 0:
		return 0, nil, errors.New("not minimally encoded")
	}
	return v, b[n:], nil
}
