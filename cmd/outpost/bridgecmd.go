package main

import (
	"context"
	"fmt"
	"io"

	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/sync/bridge"
	"github.com/outpost-edge/outpost/sync/kube"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

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
	var rc *rest.Config
	if cfg.Kubeconfig != "" {
		if rc, err = kube.LoadKubeconfig(cfg.Kubeconfig); err != nil {
			return usageError{err}
		}
	} else if rc, err = rest.InClusterConfig(); err != nil {
		return usageError{fmt.Errorf("kubeconfig: empty, and not in a cluster: %w", err)}
	}
	client, err := kube.NewClient(rc, "outpost-bridge/"+version)
	if err != nil {
		return usageError{fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)}
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
	b, err := bridge.New(bridge.Config{
		Dir: cfg.StateDir, KeepAlive: cfg.MQTT.KeepaliveDuration(), MaxMessageBytes: cfg.MQTT.MaxMessageBytes,
		Labels: cfg.Labels, WriteQPS: cfg.API.WriteQPS, WriteBurst: cfg.API.WriteBurst,
	}, bridge.Deps{Client: client, Dial: dial, Clock: clock.Real{}, Log: log})
	if err != nil {
		return err
	}
	log.Info("outpost bridge starting", "version", version, "brokers", cfg.MQTT.Brokers, "server", rc.Host)
	return b.Run(ctx)
}
