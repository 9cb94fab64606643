// Command outpost is the node agent for small ARM boards: it runs the
// node's pods on containerd from a local store that survives a lost link
// and a reboot. Run `outpost help` for its subcommands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/outpost-edge/outpost/internal/config"
)

// Stamped by the Makefile with -ldflags -X.
var (
	version = "dev"
	commit  = "unknown"
)

const usage = `outpost: a small-memory Kubernetes node agent for ARM boards

Usage:
  outpost agent [--config FILE]          run the agent
  outpost bridge --config FILE           run the MQTT bridge to the API server
  outpost bridge keygen KEYFILE          make the bridge's signing key pair:
                                         the private key into KEYFILE, the
                                         public key (for mqtt.trustedKeys)
                                         printed
  outpost bridge pubkey KEYFILE          print the public key of KEYFILE
  outpost status [--config FILE] [-o table|json] [NAMESPACE/POD]
                                         show the node's pods, or one pod
  outpost logs [NAMESPACE/]POD [-c CONTAINER] [-f] [--previous] [--tail N]
                                         print a container's log
  outpost images import [--config FILE] TARBALL...
                                         import OCI or docker-archive images
  outpost config check [--config FILE]   validate a config file and print
                                         the effective configuration
  outpost mqtt decode < PAYLOAD          print an outpost MQTT payload as YAML
  outpost version                        print version information

FILE defaults to /etc/outpost/config.yaml when that file exists.
`

// exitUsage is the exit status for bad flags or a bad config file.
const exitUsage = 2

// usageError is a problem with what the user typed or configured.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, "outpost:", line)
		}
		var ue usageError
		var ce *config.Error
		if errors.As(err, &ue) || errors.As(err, &ce) {
			os.Exit(exitUsage)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("no subcommand")}
	}
	switch args[0] {
	case "version":
		fmt.Fprintf(stdout, "outpost %s\ncommit: %s\ngo: %s\nplatform: %s/%s\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	case "agent":
		return runAgent(ctx, args[1:], stderr)
	case "bridge":
		if len(args) > 1 && (args[1] == "keygen" || args[1] == "pubkey") {
			return runBridgeKey(args[1], args[2:], stdout)
		}
		return runBridge(ctx, args[1:], stderr)
	case "status":
		return runStatus(ctx, args[1:], stdout)
	case "logs":
		return runLogs(ctx, args[1:], stdout)
	case "images":
		return runImages(ctx, args[1:], stdout, stderr)
	case "config":
		if len(args) < 2 || args[1] != "check" {
			return usageError{errors.New("usage: outpost config check [--config FILE]")}
		}
		return runConfigCheck(args[2:], stdout)
	case "mqtt":
		return runMQTT(args[1:], os.Stdin, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError{fmt.Errorf("unknown subcommand %q", args[0])}
}
