// Command containerd-shim-outpost-v2 is the runtime binary containerd runs
// for outpost's containers: containerd's runc shim (containerd-shim-runc-v2),
// with a faster start when the shim that serves the container's group is
// already running.
//
// containerd runs the runtime binary's start command for every task it
// creates, even one whose shim group is already served. The runc shim's
// start is a Go program of 11 MiB, linked dynamically: about 30 ms of CPU
// each on a busy 2-core board, a tenth of the CPU of bringing 30 pods
// back after a reboot. When the group's shim answers on its socket, this
// command prints what the runc shim's start printed when it started that
// shim, and exits: the socket's address from containerd 1.6 and 1.7's
// runc shim; from 2's, the address with the version of the task API the
// shim serves (3, the only one), which containerd then speaks to it (as
// JSON in 2.0 to 2.2, as protobuf since 2.3). Any other start (no
// record, a shim gone) it hands the runc shim as a child, and records what
// that prints; anything else (delete, a flag it does not know) it execs
// containerd-shim-runc-v2 with. The runc shim stays the one that runs
// the containers.
//
// For containerd 1.6 and 1.7's runc shim, it starts a group's shim itself
// (ownstart.go), as the runc shim's start would, but with GOMAXPROCS 1:
// that start gives its shims 4, whatever their environment says.
package main

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// recordDir holds what the runc shim's start printed for each group shim
// it started through this command, named as the shim's socket. On /run,
// so gone at a reboot with the shims. $OUTPOST_SHIM_RECORDS, in
// containerd's environment, puts it elsewhere (the tests' containerd).
var recordDir = cmp.Or(os.Getenv("OUTPOST_SHIM_RECORDS"), "/run/outpost/shim-start")

func main() {
	args := os.Args[1:]
	if out, ok := fastStart(args); ok {
		os.Stdout.WriteString(out)
		return
	}
	path, err := shimPath(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "containerd-shim-outpost-v2: %v\n", err)
		os.Exit(1)
	}
	if socket, ok := startSocket(args); ok {
		os.Exit(start(os.Stdout, os.Stdin, path, args, socket))
	}
	err = syscall.Exec(path, append([]string{path}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "containerd-shim-outpost-v2: exec %s: %v\n", path, err)
	os.Exit(1)
}

// fastStart answers a start whose group's shim is running and whose start
// was recorded: it returns what the runc shim's start printed then, with
// the shim's address written to ./address as the runc shim writes it,
// and false for anything else.
func fastStart(args []string) (string, bool) {
	socket, ok := startSocket(args)
	if !ok {
		return "", false
	}
	rec, err := os.ReadFile(filepath.Join(recordDir, filepath.Base(socket)))
	addr := "unix://" + socket
	if err != nil || !bytes.Contains(rec, []byte(addr)) || !canConnect(socket) {
		return "", false
	}
	if writeAddress("address", addr) != nil {
		return "", false
	}
	return string(rec), true
}

// start answers a start that fastStart did not, for the runc shim at
// path, the group's shim to listen on socket and containerd's runtime
// options on stdin: by ownStart where the runc shim allows, else by the
// runc shim's start (startAndRecord). It records the answer for the fast
// starts after it, and returns the exit code.
func start(stdout io.Writer, stdin io.Reader, path string, args []string, socket string) int {
	opts, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "containerd-shim-outpost-v2: read options: %v\n", err)
		return 1
	}
	if !ownStartable(path, opts) {
		return startAndRecord(stdout, bytes.NewReader(opts), path, args, socket)
	}
	flags, _, _ := parse(args)
	addr, err := ownStart(path, flags, socket)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", flags["id"], err)
		return 1
	}
	keep(socket, []byte(addr))
	io.WriteString(stdout, addr)
	return 0
}

// startAndRecord runs the runc shim at path with args and stdin, a start
// whose group's shim listens on socket, copies what it prints to stdout
// and records it when the start succeeds and it names the socket. It
// returns the exit code.
func startAndRecord(stdout io.Writer, stdin io.Reader, path string, args []string, socket string) int {
	var out bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, os.Stderr
	err := cmd.Run()
	stdout.Write(out.Bytes())
	if err != nil {
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "containerd-shim-outpost-v2: %s start: %v\n", path, err)
		return 1
	}
	if bytes.Contains(out.Bytes(), []byte("unix://"+socket)) {
		keep(socket, out.Bytes())
	}
	return 0
}

// keep records out as the answer of the start of the shim on socket, and
// prunes the records of shims gone. Not recorded, the next start of the
// group goes to the runc shim again: slower, never wrong.
func keep(socket string, out []byte) {
	record(filepath.Join(recordDir, filepath.Base(socket)), out)
	prune(recordDir)
}

// prune removes the records in dir of shims whose sockets are gone: a
// runc shim removes its socket when it exits, after its last task.
func prune(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".") {
			continue // another start's record being written
		}
		if _, err := os.Lstat(filepath.Join(socketDir, e.Name())); errors.Is(err, os.ErrNotExist) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// record writes data to path through a temporary file, renamed.
func record(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// startSocket returns, for a start, the path of the socket the runc shim
// of the task's group listens on (as the runc shim names it: from
// containerd's address, the namespace and the group in the bundle's
// spec), and false for anything else.
func startSocket(args []string) (string, bool) {
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
	return filepath.Join(socketDir, hex.EncodeToString(sum[:])), true
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
