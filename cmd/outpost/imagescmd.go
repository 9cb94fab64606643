package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/outpost-edge/outpost/internal/clock"
)

// runImages handles `outpost images import FILE...`.
func runImages(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return usageError{errors.New("usage: outpost images import [--config FILE] TARBALL...")}
	}
	fs, path := newFlags("images import")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{fmt.Errorf("images import: %w", err)}
	}
	if fs.NArg() == 0 {
		return usageError{errors.New("usage: outpost images import [--config FILE] TARBALL...")}
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := connectRuntime(ctx, cfg, ociRuntime{}, clock.Real{}, log)
	if err != nil {
		return err
	}
	defer rt.Close()
	for _, f := range fs.Args() {
		names, err := rt.ImportFile(ctx, f, "")
		if err != nil {
			return err
		}
		for _, n := range names {
			fmt.Fprintf(stdout, "imported %s from %s\n", n, f)
		}
	}
	return nil
}
