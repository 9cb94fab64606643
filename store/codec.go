package store

import (
	"errors"
	"fmt"
)

// recordFormat is the first byte of every desired-object value.
const recordFormat = 1

// encodeRecord lays out a desired-object value:
//
//	byte 0: recordFormat
//	byte 1: Source
//	rest:   the object's Kubernetes protobuf encoding
func encodeRecord(src Source, obj Object) ([]byte, error) {
	if !src.valid() {
		return nil, fmt.Errorf("invalid source %d", src)
	}
	body, err := obj.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	out := make([]byte, 2, 2+len(body))
	out[0], out[1] = recordFormat, byte(src)
	return append(out, body...), nil
}

func recordSource(v []byte) (Source, error) {
	if len(v) < 2 {
		return 0, errors.New("record too short")
	}
	if v[0] != recordFormat {
		return 0, fmt.Errorf("unknown record format %d", v[0])
	}
	s := Source(v[1])
	if !s.valid() {
		return 0, fmt.Errorf("unknown source %d", v[1])
	}
	return s, nil
}

// decodeRecord decodes a value written by encodeRecord. It copies what it
// needs, so v may be bbolt's own memory.
func decodeRecord[T any, P interface {
	*T
	Object
}](v []byte) (Record[P], error) {
	src, err := recordSource(v)
	if err != nil {
		return Record[P]{}, err
	}
	obj := P(new(T))
	// The generated Unmarshal copies byte fields, so the object does not
	// alias bbolt's mmap.
	if err := obj.Unmarshal(v[2:]); err != nil {
		return Record[P]{}, fmt.Errorf("decode object: %w", err)
	}
	return Record[P]{Source: src, Object: obj}, nil
}
