package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock"
	"github.com/outpost-edge/outpost/internal/config"
	"github.com/outpost-edge/outpost/store"
)

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(cfg.Log.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func runAgent(ctx context.Context, args []string, stderr io.Writer) error {
	fs, path := newFlags("agent")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	st, err := store.Open(cfg.StorePath(), store.Options{NodeName: cfg.NodeName})
	if err != nil {
		return err
	}
	defer st.Close()
	if cfg.Kubeconfig != "" {
		log.Warn("kubeconfig is set but API server sync is not built yet; running standalone", "kubeconfig", cfg.Kubeconfig)
	}
	board := arm.Read("/")
	if !board.MemoryCgroup {
		log.Warn("the memory cgroup controller is off: memory limits cannot be enforced (on Raspberry Pi OS add cgroup_enable=memory to /boot/firmware/cmdline.txt)", "cgroup", board.Cgroup)
	}
	a, err := agent.New(agent.Config{
		Board:       board,
		NodeName:    cfg.NodeName,
		ManifestDir: cfg.ManifestDir,
		SocketPath:  cfg.SocketPath(),
		Version:     version,
	}, agent.Deps{Store: st, Clock: clock.Real{}, Log: log})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
