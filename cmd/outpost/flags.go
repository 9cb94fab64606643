package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/outpost-edge/outpost/internal/config"
)

// defaultConfigPath is read when --config is not given and it exists.
const defaultConfigPath = "/etc/outpost/config.yaml"

// newFlags returns a flag set with --config, whose parse errors are usage
// errors.
func newFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "", "configuration file (default "+defaultConfigPath+" if it exists)")
	return fs, path
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return usageError{fmt.Errorf("%s: %w", fs.Name(), err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}

// loadConfig reads path, or the default file when path is empty and the
// default exists, or the built-in defaults.
func loadConfig(path string) (config.Config, error) {
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		} else if !errors.Is(err, os.ErrNotExist) {
			return config.Config{}, err
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		var ce *config.Error
		if !errors.As(err, &ce) {
			err = usageError{err}
		}
	}
	return cfg, err
}
