package main

import (
	"io"

	"sigs.k8s.io/yaml"
)

func runConfigCheck(args []string, stdout io.Writer) error {
	fs, path := newFlags("config check")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}
