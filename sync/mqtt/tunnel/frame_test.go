package tunnel

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

var testSession = SessionID{0x1a, 0x2b, 0x3c, 0x4d, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Kind: KindOpen, Session: testSession, Ack: 256 << 10},
		{Kind: KindAccept, Session: testSession, Nonce: 0xfeedface, Ack: 1},
		{Kind: KindData, Session: testSession, Nonce: 1<<64 - 1, Seq: 1, Ack: 0, Payload: []byte("GET / HTTP/1.1\r\n")},
		{Kind: KindData, Session: testSession, Nonce: 7, Seq: 1<<64 - 1, Ack: 1<<64 - 1, Payload: bytes.Repeat([]byte{0}, 32<<10)},
		{Kind: KindAck, Session: testSession, Nonce: 7, Ack: 128 << 10},
		{Kind: KindFin, Session: testSession, Nonce: 7, Seq: 300, Ack: 127},
		{Kind: KindClose, Session: testSession, Nonce: 7, Seq: 0},
		{Kind: KindClose, Session: testSession, Seq: 12, Payload: []byte("too many streams: 16 open (mqtt.maxStreams)")},
	} {
		t.Run(f.Kind.String(), func(t *testing.T) {
			b := f.Append([]byte("prefix"))
			if !bytes.HasPrefix(b, []byte("prefix")) {
				t.Fatalf("Append lost what b held")
			}
			got, err := DecodeFrame(b[len("prefix"):])
			if err != nil {
				t.Fatalf("DecodeFrame: %v", err)
			}
			if !reflect.DeepEqual(got, f) {
				t.Fatalf("round trip: got %+v, want %+v", got, f)
			}
			if len(b)-len("prefix") > maxHeader+len(f.Payload) {
				t.Fatalf("frame of %d bytes: header longer than maxHeader %d", len(b), maxHeader)
			}
		})
	}
}

func TestDecodeFrameRejects(t *testing.T) {
	valid := Frame{Kind: KindData, Session: testSession, Nonce: 9, Seq: 1, Ack: 5, Payload: []byte("x")}.Append(nil)
	with := func(i int, v byte) []byte {
		b := append([]byte(nil), valid...)
		b[i] = v
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "shorter than a header"},
		{"header cut", valid[:fixedHeader+1], "shorter than a header"},
		{"version 2", with(0, 2), "version 2"},
		{"kind 0", with(1, 0), "unknown kind 0"},
		{"kind 7", with(1, 7), "unknown kind 7"},
		{"seq not minimal", append(append(valid[:fixedHeader:fixedHeader], 0x81, 0x00), 0), "seq: not minimally encoded"},
		{"seq truncated", append(valid[:fixedHeader:fixedHeader], 0x81, 0x81), "seq: truncated"},
		{"seq overflows", append(append(valid[:fixedHeader:fixedHeader], bytes.Repeat([]byte{0xff}, 10)...), 0, 0), "seq: overflows"},
		{"ack missing", append(valid[:fixedHeader:fixedHeader], 1, 0x80), "ack: truncated"},
		{"data seq 0", Frame{Kind: KindData, Session: testSession, Nonce: 1}.Append(nil), "data frame: seq 0"},
		{"ack with seq", Frame{Kind: KindAck, Session: testSession, Nonce: 1, Seq: 3}.Append(nil), "ack frame: seq 3, want 0"},
		{"fin with payload", Frame{Kind: KindFin, Session: testSession, Nonce: 1, Seq: 3, Payload: []byte("x")}.Append(nil), "fin frame: 1 bytes of payload"},
		{"open with payload", Frame{Kind: KindOpen, Session: testSession, Ack: 1, Payload: []byte("x")}.Append(nil), "open frame: 1 bytes of payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeFrame(tc.b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeFrame: got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range []Frame{
		{Kind: KindOpen, Session: testSession, Ack: 256 << 10},
		{Kind: KindAccept, Session: testSession, Nonce: 42, Ack: 256 << 10},
		{Kind: KindData, Session: testSession, Nonce: 42, Seq: 1, Ack: 300, Payload: []byte("HTTP/1.1 200 OK\r\n")},
		{Kind: KindAck, Session: testSession, Nonce: 42, Ack: 1 << 40},
		{Kind: KindFin, Session: testSession, Nonce: 42, Seq: 2},
		{Kind: KindClose, Session: testSession, Nonce: 42, Seq: 2, Payload: []byte("idle for 4h0m0s")},
	} {
		f.Add(fr.Append(nil))
	}
	f.Add([]byte{Version, byte(KindData)})
	f.Add(append(bytes.Repeat([]byte{1}, fixedHeader), 0x80, 0x00, 0x00))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b)
		if err != nil {
			return
		}
		// A frame has one encoding: what decodes encodes back to the same
		// bytes.
		if again := fr.Append(nil); !bytes.Equal(again, b) {
			t.Fatalf("DecodeFrame(%x) = %+v, which encodes to %x", b, fr, again)
		}
	})
}
