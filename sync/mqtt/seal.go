package mqtt

import (
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/nacl/box"

	"github.com/outpost-edge/outpost/internal/atomicfile"
)

// Secrets are sealed to the node: each node has an X25519 key pair of its
// own (SealKeyFile in its pki directory, made at first start), publishes
// the public half in its Node's AnnotationSealKey on status/node, and the
// bridge sends a Secret's protobuf as a sealed box to it (NaCl's
// crypto_box_seal: an ephemeral X25519 key, XSalsa20-Poly1305), with the
// encoding EncodingSealed. The broker and every other node see only
// ciphertext; the envelope's signature, over the ciphertext, says who
// sent it.
const (
	// AnnotationSealKey holds the node's public seal key, in base64.
	AnnotationSealKey = "outpost.io/mqtt-seal-key"
	// SealKeyFile is the node's private seal key, in its pki directory.
	SealKeyFile = "mqtt-seal.key"
)

// SealKey is a node's seal key pair.
type SealKey struct {
	priv, pub [32]byte
}

// LoadSealKey reads the node's seal key from path, or makes one there
// (readable by its owner only) when there is none.
func LoadSealKey(path string) (*SealKey, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return createSealKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	k, err := parsePKCS8(data)
	if err != nil {
		return nil, fmt.Errorf("seal key %s: %w", path, err)
	}
	priv, ok := k.(*ecdh.PrivateKey)
	if !ok || priv.Curve() != ecdh.X25519() {
		return nil, fmt.Errorf("seal key %s: a %T, not an X25519 key", path, k)
	}
	return sealKeyOf(priv), nil
}

func createSealKey(path string) (*SealKey, error) {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("seal key: %w", err)
	}
	// A power cut leaves no key (a new one is made at the next start)
	// or the whole key.
	if err := atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return nil, fmt.Errorf("seal key %s: %w", path, err)
	}
	return sealKeyOf(priv), nil
}

func sealKeyOf(priv *ecdh.PrivateKey) *SealKey {
	k := &SealKey{}
	copy(k.priv[:], priv.Bytes())
	copy(k.pub[:], priv.PublicKey().Bytes())
	return k
}

// Public is the public half as AnnotationSealKey holds it.
func (k *SealKey) Public() string { return base64.StdEncoding.EncodeToString(k.pub[:]) }

// Open returns what sealed was sealed from to k's public key.
func (k *SealKey) Open(sealed []byte) ([]byte, error) {
	out, ok := box.OpenAnonymous(nil, sealed, &k.pub, &k.priv)
	if !ok {
		return nil, errors.New("sealed body does not open with this node's seal key (sealed to another key, or changed)")
	}
	return out, nil
}

// SealPublicKey is a node's public seal key, as the bridge reads it.
type SealPublicKey [32]byte

// ParseSealPublicKey reads a public seal key as AnnotationSealKey holds it.
func ParseSealPublicKey(s string) (*SealPublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return nil, fmt.Errorf("%q is not 32 bytes in base64", s)
	}
	var k SealPublicKey
	copy(k[:], b)
	return &k, nil
}

// Seal seals plain to the node whose public key is k.
func (k *SealPublicKey) Seal(plain []byte) ([]byte, error) {
	return box.SealAnonymous(nil, plain, (*[32]byte)(k), rand.Reader)
}

// PublicKey is k's public half, to seal to k.
func (k *SealKey) PublicKey() *SealPublicKey {
	p := SealPublicKey(k.pub)
	return &p
}

// The bridge keeps a sealed copy of each pod's tokens Secret for itself
// (BridgeTokensTopic), so a restarted bridge can read them back; and the
// index hash of a sealed Secret is keyed, so the index says nothing a
// reader could test guesses of the plaintext against. Both keys are
// derived from the bridge's signing key, so a bridge restarted with the
// same key reads what it published before.
const (
	bridgeSealContext = "outpost/v1 bridge seal key\x00"
	bridgeHashContext = "outpost/v1 bridge index hash key\x00"
)

// SealKey is the bridge's own seal key, derived from its signing key.
func (s *Signer) SealKey() *SealKey {
	sum := sha256.Sum256(append([]byte(bridgeSealContext), s.key.Seed()...))
	priv, err := ecdh.X25519().NewPrivateKey(sum[:])
	if err != nil {
		panic("mqtt: x25519 key of 32 bytes: " + err.Error()) // any 32 bytes are one
	}
	return sealKeyOf(priv)
}

// HashKey is the key of the bridge's SealedHash, derived from its
// signing key.
func (s *Signer) HashKey() []byte {
	sum := sha256.Sum256(append([]byte(bridgeHashContext), s.key.Seed()...))
	return sum[:]
}

// SealedHash is the hash an index keeps of a Secret sealed to the node
// whose key is to: the first 8 bytes of HMAC-SHA256 under key over the
// node's key and the Secret's protobuf. It changes with either, and
// without key it tells nothing of body.
func SealedHash(key []byte, to *SealPublicKey, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(to[:])
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil)[:8])
}
