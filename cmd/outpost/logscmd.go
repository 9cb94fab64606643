package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/agent/crilog"
	"github.com/outpost-edge/outpost/internal/clock"
)

// runLogs prints a container's log from logDir, as kubectl logs would.
func runLogs(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlags("logs")
	container := fs.String("c", "", "container name (needed when the pod has several)")
	follow := fs.Bool("f", false, "follow the log")
	previous := fs.Bool("previous", false, "the previous attempt of the container")
	tail := fs.Int64("tail", -1, "lines from the end to show (-1: all)")
	timestamps := fs.Bool("timestamps", false, "prefix each line with its time")
	since := fs.Duration("since", 0, "only lines newer than this (e.g. 5m)")
	var target string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		target, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return usageError{fmt.Errorf("%s: %w", fs.Name(), err)}
	}
	if fs.NArg() == 1 && target == "" {
		target = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	if target == "" {
		return usageError{errors.New("usage: outpost logs [NAMESPACE/]POD [-c CONTAINER] [-f] [--previous] [--tail N] [--since DURATION] [--timestamps]")}
	}
	ns, pod, ok := strings.Cut(target, "/")
	if !ok {
		ns, pod = "default", target
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	file, err := logFile(cfg.LogDir, ns, pod, *container, *previous)
	if err != nil {
		return err
	}
	opts := crilog.ReadOptions{Follow: *follow, TailLines: *tail, Timestamps: *timestamps}
	if *since > 0 {
		opts.Since = time.Now().Add(-*since)
	}
	return crilog.Read(ctx, file, opts, clock.Real{}, stdout)
}

// logFile finds the log of a container attempt: the newest, or the one
// before it with previous.
func logFile(logDir, ns, pod, container string, previous bool) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(logDir, ns+"_"+pod+"_*"))
	if len(dirs) == 0 {
		return "", fmt.Errorf("pod %s/%s: no logs in %s", ns, pod, logDir)
	}
	// The newest pod directory, should a pod of that name have had several UIDs.
	sort.Slice(dirs, func(i, j int) bool { return modTime(dirs[i]).After(modTime(dirs[j])) })
	dir := dirs[0]
	if container == "" {
		entries, _ := os.ReadDir(dir)
		var names []string
		for _, e := range entries {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		if len(names) != 1 {
			return "", usageError{fmt.Errorf("pod %s/%s has containers %s: choose one with -c", ns, pod, strings.Join(names, ", "))}
		}
		container = names[0]
	}
	attempts := crilog.Attempts(filepath.Join(dir, container))
	i := 0
	if previous {
		i = 1
	}
	if len(attempts) <= i {
		what := "no log"
		if previous {
			what = "no previous attempt"
		}
		return "", fmt.Errorf("pod %s/%s container %s: %s", ns, pod, container, what)
	}
	return filepath.Join(dir, container, strconv.Itoa(attempts[i])+".log"), nil
}

func modTime(p string) time.Time {
	st, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}
