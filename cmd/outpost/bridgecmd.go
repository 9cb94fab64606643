package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/agent/server"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/sync/bridge"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// bridgeGCPercent is the bridge's GOGC unless the environment sets one.
const bridgeGCPercent = 50

// runBridge runs `outpost bridge --config FILE` until ctx ends.
func runBridge(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlags("bridge")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := config.LoadBridge(*path)
	if err != nil {
		return err
	}
	log := newLogger(config.Config{Log: cfg.Log}, stderr).With("component", "bridge")
	// The bridge's heap is mostly what it keeps per node, and grows with
	// the fleet: collecting at 50 % growth instead of 100 % keeps its
	// RSS near what it keeps, for some CPU (a quarter of a core at 2,000
	// nodes here). GOGC in the environment still wins, and GOMEMLIMIT
	// works beside it.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(bridgeGCPercent)
	}
	var rc *rest.Config
	if cfg.Kubeconfig != "" {
		if rc, err = kube.LoadKubeconfig(cfg.Kubeconfig); err != nil {
			return usageError{err}
		}
	} else if rc, err = rest.InClusterConfig(); err != nil {
		return usageError{fmt.Errorf("kubeconfig: empty, and not in a cluster: %w", err)}
	}
	// The bridge writes for a fleet: each node's Lease every 10 s (200
	// a second at 2,000 nodes) besides its statuses, paced per node by
	// api.writeQPS. The client's own limit is only a ceiling far above.
	rc.QPS, rc.Burst = 2000, 4000
	client, err := kube.NewClient(rc, "outpost-bridge/"+version)
	if err != nil {
		return usageError{fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)}
	}
	// Replicas: where their Leases are, who this one is, and its own
	// broker identity.
	var namespace, identity string
	if r := cfg.Replicas; r.Shards > 0 {
		namespace, identity = r.Namespace, r.Identity
		if namespace == "" {
			namespace = "default"
			if ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(ns) > 0 {
				namespace = strings.TrimSpace(string(ns))
			}
		}
		if identity == "" {
			if identity, err = os.Hostname(); err != nil {
				return fmt.Errorf("replicas.identity: empty, and no host name: %w", err)
			}
			identity = strings.ToLower(identity)
		}
		for _, f := range []*string{&cfg.MQTT.CertFile, &cfg.MQTT.KeyFile} {
			*f = strings.ReplaceAll(*f, "{replica}", identity)
		}
	}
	tc, err := mqttTLS(cfg.MQTT)
	if err != nil {
		return usageError{err}
	}
	password, err := mqttPassword(cfg.MQTT)
	if err != nil {
		return usageError{err}
	}
	dial := mqtt.PahoDialer(mqtt.PahoConfig{
		Brokers: cfg.MQTT.Brokers, TLS: tc, ClientID: cfg.MQTT.ClientID, Username: cfg.MQTT.Username, Password: password,
		KeepAlive: cfg.MQTT.KeepaliveDuration(),
	})
	var signer *mqtt.Signer
	if f := cfg.MQTT.SigningKeyFile; f != "" {
		key, err := readSigningKey(f)
		if err != nil {
			return usageError{fmt.Errorf("mqtt.signingKeyFile: %w", err)}
		}
		signer = mqtt.NewSigner(key)
		log.Info("signing desired state", "key", signer.ID().String(), "public", mqtt.FormatPublicKey(signer.Public()))
	} else {
		log.Warn("mqtt.signingKeyFile is empty: desired state is published unsigned, and nodes that trust keys refuse it (docs/mqtt.md, signed desired state)")
	}
	bc := bridge.Config{
		Dir: cfg.StateDir, KeepAlive: cfg.MQTT.KeepaliveDuration(), MaxMessageBytes: cfg.MQTT.MaxMessageBytes,
		Labels: cfg.Labels, WriteQPS: cfg.API.WriteQPS, WriteBurst: cfg.API.WriteBurst, Signer: signer,
	}
	if r := cfg.Replicas; r.Shards > 0 {
		bc.Shards, bc.Namespace, bc.Identity = r.Shards, namespace, identity
		if signer == nil {
			log.Warn("replicas without mqtt.signingKeyFile: a node that moves to another replica has its tokens requested and its Secrets sent again")
		}
	}
	if bc.Kubelet, err = bridgeKubeletAPI(cfg.KubeletAPI, client, log); err != nil {
		return usageError{err}
	}
	b, err := bridge.New(bc, bridge.Deps{Client: client, Dial: dial, Clock: clock.Real{}, Log: log})
	if err != nil {
		return err
	}
	log.Info("outpost bridge starting", "version", version, "brokers", cfg.MQTT.Brokers, "server", rc.Host)
	return b.Run(ctx)
}

// runBridgeKey runs `outpost bridge keygen KEYFILE`, which writes a new
// signing key to KEYFILE (never over an existing file) and prints its
// public key, and `outpost bridge pubkey KEYFILE`, which prints the
// public key of KEYFILE: the line mqtt.trustedKeys takes.
func runBridgeKey(cmd string, args []string, stdout io.Writer) error {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		return usageError{fmt.Errorf("usage: outpost bridge %s KEYFILE", cmd)}
	}
	path := args[0]
	var key ed25519.PrivateKey
	var err error
	if cmd == "pubkey" {
		if key, err = readSigningKey(path); err != nil {
			return fmt.Errorf("bridge pubkey: %w", err)
		}
	} else {
		if key, err = mqtt.GenerateKey(); err != nil {
			return fmt.Errorf("bridge keygen: %w", err)
		}
		pem, err := mqtt.MarshalPrivateKey(key)
		if err != nil {
			return fmt.Errorf("bridge keygen: %w", err)
		}
		if err := writeNewFile(path, pem); err != nil {
			return fmt.Errorf("bridge keygen: %w", err)
		}
	}
	_, err = fmt.Fprintln(stdout, mqtt.FormatPublicKey(key.Public().(ed25519.PublicKey)))
	return err
}

// readSigningKey reads the bridge's private signing key from path.
func readSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := mqtt.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// writeNewFile writes data to path, readable by its owner only; it
// refuses a path that exists, so a key in use is never replaced.
func writeNewFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// bridgeKubeletAPI is the kubelet API the bridge serves for its nodes,
// when kubeletAPI.address is set: agent/server's Guard lets requests in
// as the agent does, asking the API server with the bridge's client.
func bridgeKubeletAPI(k config.BridgeKubeletAPI, client *kube.Client, log *slog.Logger) (bridge.KubeletAPI, error) {
	if k.Address == "" {
		return bridge.KubeletAPI{}, nil
	}
	var cert tls.Certificate
	var err error
	if k.TLSCertFile != "" {
		if cert, err = tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile); err != nil {
			return bridge.KubeletAPI{}, fmt.Errorf("kubeletAPI.tlsCertFile %s: %w", k.TLSCertFile, err)
		}
	} else if cert, err = server.SelfSigned("outpost-bridge", []string{k.Address}, time.Now()); err != nil {
		return bridge.KubeletAPI{}, fmt.Errorf("kubeletAPI: %w", err)
	}
	cas, err := server.LoadClientCAs(k.ClientCAFile)
	if err != nil {
		return bridge.KubeletAPI{}, fmt.Errorf("kubeletAPI.clientCAFile: %w", err)
	}
	guard := server.NewGuard(server.GuardConfig{ClientCAs: cas},
		server.GuardDeps{Reviewer: reviewer{client}, Clock: clock.Real{}, Log: log.With("part", "kubelet-api")})
	first, last := k.PortRange()
	log.Info("serving the kubelet api of mqtt nodes", "address", k.Address, "ports", k.Ports)
	return bridge.KubeletAPI{
		Address: k.Address, Listen: k.Listen, FirstPort: first, LastPort: last,
		Certificate: cert, Check: guard.Check, IdleTimeout: k.IdleTimeout(),
	}, nil
}
