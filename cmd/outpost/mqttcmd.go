package main

import (
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/outpost-edge/outpost/sync/mqtt"
)

// maxDecodeBytes bounds what `outpost mqtt decode` reads.
const maxDecodeBytes = 256 << 20

// runMQTT runs `outpost mqtt decode`: one payload from stdin, printed as
// YAML (mosquitto_sub -C 1 -t TOPIC | outpost mqtt decode).
func runMQTT(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "decode" {
		return usageError{errors.New("usage: outpost mqtt decode < PAYLOAD")}
	}
	if len(args) > 1 {
		return usageError{fmt.Errorf("mqtt decode: unexpected argument %q; the payload comes on standard input", args[1])}
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxDecodeBytes))
	if err != nil {
		return fmt.Errorf("mqtt decode: read standard input: %w", err)
	}
	d, err := mqtt.Decode(data)
	if err != nil {
		return fmt.Errorf("mqtt decode: %w", err)
	}
	out, err := yaml.Marshal(d)
	if err != nil {
		return fmt.Errorf("mqtt decode: %w", err)
	}
	_, err = stdout.Write(out)
	return err
}
