package mqtt

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"strings"
)

// Desired envelopes can be signed by the bridge (ed25519) and checked by
// the node against the public keys it trusts (mqtt.trustedKeys). The
// signature is the last header field, tag 5:
//
//	KEYID (8 bytes)  the first 8 bytes of the SHA-256 of the public key
//	SIG (64 bytes)   Ed25519ph (RFC 8032) with the context signContext
//
// over the SHA-512 of the topic (a uvarint length, then the topic) and
// the whole envelope without the signature field: so it covers the
// topic (node, kind, namespace and name), the kind, the generation, the
// encoding, the time of issue and the body. The tag's high bit is not
// set: a node that trusts no key skips it.
const (
	tagSignature = 5
	keyIDLen     = 8
	sigFieldLen  = keyIDLen + ed25519.SignatureSize
	signContext  = "outpost/v1 desired"
	// PublicKeyPrefix starts a public key as mqtt.trustedKeys spells it.
	PublicKeyPrefix = "ed25519:"
)

// KeyID is the short name of a public key in a signature.
type KeyID [keyIDLen]byte

// String is the key id in hex, as logs show it.
func (id KeyID) String() string { return hex.EncodeToString(id[:]) }

// KeyIDOf returns the key id of pub.
func KeyIDOf(pub ed25519.PublicKey) KeyID {
	sum := sha256.Sum256(pub)
	var id KeyID
	copy(id[:], sum[:keyIDLen])
	return id
}

// Signer signs desired envelopes with the bridge's private key.
type Signer struct {
	key ed25519.PrivateKey
	id  KeyID
}

// NewSigner returns a Signer for key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, id: KeyIDOf(key.Public().(ed25519.PublicKey))}
}

// ID is the id of the signer's public key.
func (s *Signer) ID() KeyID { return s.id }

// Public is the signer's public key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Seal lays out e for topic with its signature; e.Signature is ignored.
func (s *Signer) Seal(topic string, e Envelope) []byte {
	e.Signature = nil
	head := e.marshalHeader(sigFieldLen + 2)
	h := signedHash(topic, head, []byte{tagEnd}, e.Body)
	sig, err := s.key.Sign(nil, h.Sum(nil), &ed25519.Options{Hash: crypto.SHA512, Context: signContext})
	if err != nil {
		panic("mqtt: ed25519ph sign: " + err.Error()) // only for a wrong hash or context length
	}
	return e.appendRest(head, append(s.id[:], sig...))
}

// signedHash is the SHA-512 a signature signs: the topic, then the
// envelope's bytes without the signature field, given in parts.
func signedHash(topic string, parts ...[]byte) hash.Hash {
	h := sha512.New()
	h.Write(binary.AppendUvarint(nil, uint64(len(topic))))
	h.Write([]byte(topic))
	for _, p := range parts {
		h.Write(p)
	}
	return h
}

// Keyring holds the public keys a node trusts.
type Keyring struct {
	keys map[KeyID]ed25519.PublicKey
}

// NewKeyring returns a Keyring of keys; nil when there are none, which
// means signatures are not checked.
func NewKeyring(keys ...ed25519.PublicKey) *Keyring {
	if len(keys) == 0 {
		return nil
	}
	k := &Keyring{keys: map[KeyID]ed25519.PublicKey{}}
	for _, pub := range keys {
		k.keys[KeyIDOf(pub)] = pub
	}
	return k
}

// Errors of Verify, by what failed.
var (
	ErrUnsigned     = errors.New("not signed")
	ErrUnknownKey   = errors.New("signed with a key not in mqtt.trustedKeys")
	ErrBadSignature = errors.New("signature does not match (another topic or node, or changed)")
)

// Verify checks that payload, which decoded as e, is signed for topic by
// a trusted key, and returns that key's id.
func (k *Keyring) Verify(topic string, payload []byte, e Envelope) (KeyID, error) {
	var id KeyID
	if len(e.Signature) != sigFieldLen || e.sigAt <= 0 {
		return id, ErrUnsigned
	}
	copy(id[:], e.Signature[:keyIDLen])
	pub, ok := k.keys[id]
	if !ok {
		return id, fmt.Errorf("key %s: %w", id, ErrUnknownKey)
	}
	h := signedHash(topic, payload[:e.sigAt], payload[e.sigEnd:])
	if err := ed25519.VerifyWithOptions(pub, h.Sum(nil), e.Signature[keyIDLen:], &ed25519.Options{Hash: crypto.SHA512, Context: signContext}); err != nil {
		return id, fmt.Errorf("key %s: %w", id, ErrBadSignature)
	}
	return id, nil
}

// GenerateKey makes a signing key pair.
func GenerateKey() (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	return priv, err
}

// MarshalPrivateKey encodes key as a PKCS #8 PEM block, as openssl
// writes ed25519 keys.
func MarshalPrivateKey(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey reads an ed25519 private key from a PKCS #8 PEM block.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	k, err := parsePKCS8(data)
	if err != nil {
		return nil, err
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ed25519 key", k)
	}
	return priv, nil
}

// parsePKCS8 reads the private key of a PKCS #8 PEM block.
func parsePKCS8(data []byte) (any, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM \"PRIVATE KEY\" block")
	}
	return x509.ParsePKCS8PrivateKey(b.Bytes)
}

// FormatPublicKey spells pub as mqtt.trustedKeys takes it:
// "ed25519:" and the key in standard base64.
func FormatPublicKey(pub ed25519.PublicKey) string {
	return PublicKeyPrefix + base64.StdEncoding.EncodeToString(pub)
}

// ParsePublicKey reads a key spelled as FormatPublicKey does.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	rest, ok := strings.CutPrefix(s, PublicKeyPrefix)
	if !ok {
		return nil, fmt.Errorf("%q does not start with %q", s, PublicKeyPrefix)
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%q is not %d bytes in base64", s, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}
