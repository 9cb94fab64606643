package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Self-signed serving certificates last a year and are made anew within
// a month of expiry, or when the node's names or addresses change.
const (
	selfSignedValidity = 365 * 24 * time.Hour
	renewBefore        = 30 * 24 * time.Hour
)

// servingCert returns the server's certificate: the configured files, or
// a self-signed one kept in CertDir.
func (s *Server) servingCert() (tls.Certificate, error) {
	if s.cfg.CertFile != "" {
		c, err := tls.LoadX509KeyPair(s.cfg.CertFile, s.cfg.KeyFile)
		if err != nil {
			return c, fmt.Errorf("server.tlsCertFile %s: %w", s.cfg.CertFile, err)
		}
		return c, nil
	}
	if s.cfg.CertDir == "" {
		return tls.Certificate{}, errors.New("no serving certificate: set server.tlsCertFile or a state directory")
	}
	certPath := filepath.Join(s.cfg.CertDir, "outpost-serving.crt")
	keyPath := filepath.Join(s.cfg.CertDir, "outpost-serving.key")
	names, ips := splitHosts(s.cfg.Hosts)
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err == nil && s.deps.Clock.Now().Add(renewBefore).Before(leaf.NotAfter) &&
			slices.Equal(leaf.DNSNames, names) && sameIPs(leaf.IPAddresses, ips) {
			return c, nil
		}
	}
	certPEM, keyPEM, err := selfSigned(s.cfg.NodeName, names, ips, s.deps.Clock.Now())
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	if err := os.MkdirAll(s.cfg.CertDir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	s.deps.Log.Info("kubelet api: made a self-signed serving certificate", "path", certPath, "names", names, "ips", ips)
	return tls.X509KeyPair(certPEM, keyPEM)
}

func splitHosts(hosts []string) (names []string, ips []net.IP) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" && !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return names, ips
}

func sameIPs(a, b []net.IP) bool {
	return slices.EqualFunc(a, b, func(x, y net.IP) bool { return x.Equal(y) })
}

// selfSigned makes a certificate for the node, as kubelet does without
// serving certificates of its own: its own CA, signed by itself.
func selfSigned(node string, names []string, ips []net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node + "@" + fmt.Sprint(now.Unix())},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(selfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
		DNSNames: names, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// loadClientCAs reads the PEM bundle of CAs whose client certificates
// the server trusts.
func loadClientCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("server.clientCAFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("server.clientCAFile %s: no PEM certificates in it", path)
	}
	return pool, nil
}

// SelfSigned makes a self-signed serving certificate for name, valid for
// hosts (names and IP addresses): the bridge's, which it makes at every
// start.
func SelfSigned(name string, hosts []string, now time.Time) (tls.Certificate, error) {
	names, ips := splitHosts(hosts)
	certPEM, keyPEM, err := selfSigned(name, names, ips, now)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
