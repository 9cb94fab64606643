package store

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func FuzzDecodeRecord(f *testing.F) {
	good, _ := encodeRecord(SourceStatic, typicalPod())
	f.Add(good)
	f.Add([]byte{recordFormat, byte(SourceAPI)})
	f.Add([]byte{9, 9, 9})
	f.Fuzz(func(t *testing.T, v []byte) {
		rec, err := decodeRecord[corev1.Pod](v)
		if err != nil {
			return
		}
		// Whatever decodes must encode again and decode to the same source.
		again, err := encodeRecord(rec.Source, rec.Object)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if src, err := recordSource(again); err != nil || src != rec.Source {
			t.Fatalf("round trip source %v %v", src, err)
		}
	})
}

func FuzzDecodeEntry(f *testing.F) {
	f.Add(encodeEntry(7, []byte("status")))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		seq, val, err := decodeEntry(raw)
		if err != nil {
			return
		}
		if seq == 0 || len(val) != len(raw)-8 {
			t.Fatalf("decoded seq %d, %d bytes from %d", seq, len(val), len(raw))
		}
	})
}

func FuzzDecodeRestart(f *testing.F) {
	f.Add([]byte(`{"count":3,"lastExitCode":1,"backoffUntil":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"count":-1}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		var st RestartState
		if err := decodeRestart(v, &st); err == nil && st.Count < 0 {
			t.Fatalf("accepted negative count %d", st.Count)
		}
	})
}
