// Command containerd-shim-outpost-v2 is the runtime binary containerd runs
// for outpost's containers: containerd's runc shim (containerd-shim-runc-v2),
// with a faster start when the shim that serves the container's group is
// already running.
//
// containerd 1.6 runs the runtime binary's start command for every task
// it creates, even one whose shim group is already served. The runc
// shim's start is a Go program of 11 MiB, linked dynamically: about 30 ms
// of CPU each on a busy 2-core board, a tenth of the CPU of bringing
// 30 pods back after a reboot. When the group's shim answers on its
// socket, this command does what the runc shim's start does then (writes
// the socket's address to the bundle and prints it) and exits; in every
// other case (the group's first task, a shim gone, delete, a flag it does
// not know) it execs containerd-shim-runc-v2 with the same arguments, so
// the runc shim stays the one that runs the containers.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// runcShim is the binary everything but a fast start is handed to.
const runcShim = "containerd-shim-runc-v2"

// socketDir is where the runc shim puts its sockets: containerd 1.6's
// and 2.x's defaults.DefaultStateDir + "/s", whatever containerd's own
// state directory. A variable for the tests.
var socketDir = "/run/containerd/s"

// groupAnnotations are the spec annotations the runc shim groups
// containers by, in its order: outpost sets the first.
var groupAnnotations = []string{"io.containerd.runc.v2.group", "io.kubernetes.cri.sandbox-id"}

func main() {
	if addr, ok := fastStart(os.Args[1:]); ok {
		os.Stdout.WriteString(addr)
		return
	}
	path, err := shimPath(os.Args[1:])
	if err == nil {
		err = syscall.Exec(path, append([]string{path}, os.Args[1:]...), os.Environ())
	}
	fmt.Fprintf(os.Stderr, "containerd-shim-outpost-v2: exec %s: %v\n", runcShim, err)
	os.Exit(1)
}

// fastStart answers a start whose group's shim is running: it returns the
// shim's address, written to ./address as the runc shim writes it, and
// false for anything else.
func fastStart(args []string) (string, bool) {
	flags, action, ok := parse(args)
	if !ok || action != "start" || flags["namespace"] == "" || flags["address"] == "" || flags["id"] == "" {
		return "", false
	}
	group := flags["id"]
	data, err := os.ReadFile("config.json")
	if err != nil {
		return "", false
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(data, &spec) != nil {
		return "", false
	}
	for _, a := range groupAnnotations {
		if g, ok := spec.Annotations[a]; ok {
			group = g
			break
		}
	}
	sum := sha256.Sum256([]byte(filepath.Join(flags["address"], flags["namespace"], group)))
	path := filepath.Join(socketDir, hex.EncodeToString(sum[:]))
	if !canConnect(path) {
		return "", false
	}
	addr := "unix://" + path
	if writeAddress("address", addr) != nil {
		return "", false
	}
	return addr, true
}

// parse reads the shim's command line as Go's flag package would (-name
// value, -name=value, --name, boolean -debug and -v) and returns the
// flags, the action, and false for a flag it does not know.
func parse(args []string) (map[string]string, string, bool) {
	flags := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			return flags, a, i == len(args)-1
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		switch name {
		case "debug", "v":
			flags[name] = "true"
		case "namespace", "address", "publish-binary", "id", "bundle", "socket":
			if !hasValue {
				if i+1 >= len(args) {
					return nil, "", false
				}
				i++
				value = args[i]
			}
			flags[name] = value
		default:
			return nil, "", false
		}
	}
	return flags, "", false
}

// canConnect reports whether a unix socket at path accepts a connection,
// without waiting: a refused, missing or full socket is the runc shim's
// to sort out.
func canConnect(path string) bool {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	return syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}) == nil
}

// writeAddress writes addr to path as the runc shim does: through
// .path, created exclusively and synced, then renamed.
func writeAddress(path, addr string) error {
	tmp := "." + path
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_SYNC, 0o666)
	if err != nil {
		return err
	}
	_, err = f.WriteString(addr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// shimPath finds containerd-shim-runc-v2 as containerd finds a runtime
// binary: on PATH, or beside containerd (the -publish-binary flag).
func shimPath(args []string) (string, error) {
	if p, err := exec.LookPath(runcShim); err == nil {
		return p, nil
	}
	flags, _, _ := parse(args)
	if pub := flags["publish-binary"]; pub != "" {
		p := filepath.Join(filepath.Dir(pub), runcShim)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH nor beside containerd", runcShim)
}
