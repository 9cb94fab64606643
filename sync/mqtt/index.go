package mqtt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Index lists every desired object of one scope (a node's, or the
// cluster's Services and EndpointSlices) with its generation. The bridge
// keeps it retained beside the objects; the node reads it on every
// connect and fetches only the objects whose generation differs from the
// store's, and deletes those the index no longer lists. So the node
// converges whatever the broker's queue dropped, at the cost of the index
// and the k objects that changed.
//
// Its body is text, one object a line, sorted, with the generation and
// the hash of the object's envelope body (BodyHash), by which a bridge
// restarted with no memory tells what it need not publish again:
//
//	pods/default/web 81234 9f2c4e1a0b3d5c7e
//	configmaps/default/web-config 80011 03ab5e6f7c8d9e0f
type Index struct {
	// Generation orders indexes; an object stored with a newer
	// generation is not deleted for being absent from an older index.
	Generation uint64
	// Entries map "kind/namespace/name" to the object's generation.
	Entries map[string]uint64
	// Hashes map the same keys to BodyHash of what was published; a
	// key may have none.
	Hashes map[string]string
}

// BodyHash is the hash an index keeps of an object's envelope body: the
// first 8 bytes of its SHA-256, in hex.
func BodyHash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:8])
}

// IndexKey is an object's key in an index.
func IndexKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

// Marshal returns the index's body.
func (x Index) Marshal() []byte {
	keys := make([]string, 0, len(x.Entries))
	for k := range x.Entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(x.Entries[k], 10))
		if h := x.Hashes[k]; h != "" {
			b.WriteByte(' ')
			b.WriteString(h)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Envelope wraps the index for publishing.
func (x Index) Envelope() Envelope {
	return Envelope{Kind: "Index", Generation: x.Generation, Encoding: EncodingIndex, Body: x.Marshal()}
}

// ParseIndex reads an index of scope from its envelope; every line's kind
// must belong to the scope and every name must be valid.
func ParseIndex(e Envelope, scope Scope) (Index, error) {
	if e.Kind != "Index" || e.Encoding != EncodingIndex {
		return Index{}, fmt.Errorf("index: kind %s, encoding %s; want Index, index", e.Kind, e.Encoding)
	}
	kinds := nodeKinds
	if scope == ScopeCluster {
		kinds = clusterKinds
	}
	x := Index{Generation: e.Generation, Entries: map[string]uint64{}, Hashes: map[string]string{}}
	for i, line := range strings.Split(string(e.Body), "\n") {
		if line == "" {
			continue
		}
		fields := strings.Split(line, " ")
		if len(fields) != 2 && len(fields) != 3 {
			return Index{}, fmt.Errorf("index line %d: not KIND/NAMESPACE/NAME GENERATION [HASH]", i+1)
		}
		key, gen := fields[0], fields[1]
		if len(fields) == 3 {
			h := fields[2]
			if _, err := hex.DecodeString(h); err != nil || len(h) != 16 {
				return Index{}, fmt.Errorf("index line %d: hash %q is not 16 hex digits", i+1, h)
			}
			x.Hashes[key] = h
		}
		parts := strings.Split(key, "/")
		if len(parts) != 3 || !oneOf(parts[0], kinds) {
			return Index{}, fmt.Errorf("index line %d: %q is not one of %s followed by /NAMESPACE/NAME", i+1, key, strings.Join(kinds, ", "))
		}
		if err := checkName(parts[1], parts[2]); err != nil {
			return Index{}, fmt.Errorf("index line %d: %w", i+1, err)
		}
		g, err := strconv.ParseUint(gen, 10, 64)
		if err != nil {
			return Index{}, fmt.Errorf("index line %d: generation %q is not a number", i+1, gen)
		}
		if _, dup := x.Entries[key]; dup {
			return Index{}, fmt.Errorf("index line %d: %s listed twice", i+1, key)
		}
		x.Entries[key] = g
	}
	return x, nil
}
