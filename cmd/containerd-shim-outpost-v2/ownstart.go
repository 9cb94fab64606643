package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// shimGOMAXPROCS is the GOMAXPROCS of the runc shims this command starts
// itself. containerd 1.6 and 1.7's runc shim starts its daemon with
// GOMAXPROCS=4, set after its environment's, so nothing else can lower
// it: 4 shims with 4 Ps each on a 2-core board spend CPU waking and
// parking threads when tasks are created at once. With 1, an offline
// reboot of 30 pods came back in 838 ms against 917 on crun and in 975
// against 1113 on runc, with 11 and 15 % less CPU (medians of 6 and 5
// alternating runs, docs/benchmarks.md).
const shimGOMAXPROCS = "1"

// versionCache is the file in recordDir that holds the version of each
// runc shim binary asked (`-v`), named with a dot so prune leaves it.
const versionCache = "runc-shim.version"

// ownStartable reports whether the runc shim at path can be started as
// ownStart does, with opts the runtime options containerd gave the start
// on its stdin: a runc shim of containerd 1.6 or 1.7 (whose start answers
// with the bare address, and whose daemon takes the flags below), no
// shim cgroup to join and no core scheduling asked.
func ownStartable(path string, opts []byte) bool {
	if os.Getenv("SCHED_CORE") != "" {
		return false
	}
	if cg, ok := shimCgroup(opts); !ok || cg != "" {
		return false
	}
	v := shimVersion(path)
	return strings.HasPrefix(v, "1.6.") || strings.HasPrefix(v, "1.7.")
}

// ownStart does what the runc shim's start of containerd 1.6 and 1.7
// does for the first task of a group (runtime/v2/runc/manager), with the
// shim daemon's GOMAXPROCS set to shimGOMAXPROCS: it listens on socket,
// writes its address to ./address, starts the runc shim at path as the
// daemon on that socket (file descriptor 3) in its own process group,
// gives it an OOM score one above containerd's, and returns the address
// to print. A shim already listening there is answered for, as the runc
// shim's start does.
func ownStart(path string, flags map[string]string, socket string) (_ string, err error) {
	addr := "unix://" + socket
	l, err := listenSocket(socket)
	if errors.Is(err, syscall.EADDRINUSE) {
		if canConnect(socket) {
			return addr, writeAddress("address", addr)
		}
		if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("remove pre-existing socket: %w", err)
		}
		l, err = listenSocket(socket)
	}
	if err != nil {
		return "", fmt.Errorf("create new shim socket: %w", err)
	}
	defer func() {
		if err != nil {
			l.Close()
			os.Remove(socket)
		}
	}()
	if err := writeAddress("address", addr); err != nil {
		return "", err
	}
	f, err := l.File()
	if err != nil {
		return "", err
	}
	defer f.Close()
	args := []string{"-namespace", flags["namespace"], "-id", flags["id"], "-address", flags["address"]}
	if flags["debug"] != "" {
		args = append(args, "-debug")
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+shimGOMAXPROCS)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			cmd.Process.Kill()
		}
	}()
	if err := adjustOOMScore(os.Getppid(), cmd.Process.Pid); err != nil {
		return "", fmt.Errorf("failed to adjust OOM score for shim: %w", err)
	}
	return addr, nil
}

// listenSocket makes the unix socket path, as the runc shim does (mode 0600),
// left in place when the listener closes.
func listenSocket(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		os.Remove(path)
		return nil, err
	}
	return l, nil
}

// adjustOOMScore gives process pid the OOM score adjustment of process
// parent plus one (at most 1000), as the runc shim gives its daemon:
// the kernel kills the shim before containerd.
func adjustOOMScore(parent, pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", parent))
	if err != nil {
		return err
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("parent OOM score %q: %w", b, err)
	}
	return os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(min(score+1, 1000))), 0)
}

// shimVersion returns the version the runc shim at path says it is
// (`-v`: "Version: 1.6.20~ds1"), or "" when it does not say. It asks
// once per binary (its path, size, time and inode) and keeps the answer
// in recordDir, which is gone at a reboot and after a package upgrade
// no longer matches.
func shimVersion(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if st == nil {
		return ""
	}
	id := fmt.Sprintf("%s %d %d %d", path, fi.Size(), fi.ModTime().UnixNano(), st.Ino)
	cache := filepath.Join(recordDir, versionCache)
	if b, err := os.ReadFile(cache); err == nil {
		if cached, v, ok := strings.Cut(strings.TrimSpace(string(b)), "\t"); ok && cached == id {
			return v
		}
	}
	out, err := exec.Command(path, "-v").Output()
	if err != nil {
		return ""
	}
	v := parseVersion(out)
	if v != "" {
		record(cache, []byte(id+"\t"+v+"\n"))
	}
	return v
}

// parseVersion returns the version in a runc shim's -v output, without
// a leading v.
func parseVersion(out []byte) string {
	for line := range bytes.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "Version:"); ok {
			return strings.TrimPrefix(strings.TrimSpace(v), "v")
		}
	}
	return ""
}

// shimCgroup returns the shim_cgroup of the runc shim options in data:
// what containerd writes to a start's stdin, a protobuf Any of
// containerd.runc.v1.Options (nothing for the defaults). It returns
// false for anything else.
func shimCgroup(data []byte) (string, bool) {
	if len(data) == 0 {
		return "", true
	}
	var typeURL string
	var value []byte
	if !fields(data, func(num int, b []byte) {
		switch num {
		case 1:
			typeURL = string(b)
		case 2:
			value = b
		}
	}) || !strings.HasSuffix(typeURL, "containerd.runc.v1.Options") {
		return "", false
	}
	var cg string
	ok := fields(value, func(num int, b []byte) {
		if num == 3 { // string shim_cgroup = 3
			cg = string(b)
		}
	})
	return cg, ok
}

// fields calls f with the number of each field of the protobuf message
// data and, for a length-delimited one, its bytes. It returns false when
// data is not a well-formed message.
func fields(data []byte, f func(num int, b []byte)) bool {
	for len(data) > 0 {
		key, n := binary.Uvarint(data)
		if n <= 0 || key>>3 == 0 {
			return false
		}
		data = data[n:]
		var b []byte
		switch key & 7 {
		case 0:
			if _, n = binary.Uvarint(data); n <= 0 {
				return false
			}
			data = data[n:]
		case 1, 5:
			size := 8
			if key&7 == 5 {
				size = 4
			}
			if len(data) < size {
				return false
			}
			data = data[size:]
		case 2:
			l, n := binary.Uvarint(data)
			if n <= 0 || l > uint64(len(data)-n) {
				return false
			}
			b, data = data[n:n+int(l)], data[n+int(l):]
		default:
			return false
		}
		f(int(key>>3), b)
	}
	return true
}
