package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

func runStatus(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlags("status")
	output := fs.String("o", "table", "output format: table or json")
	var podArg string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		podArg, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return usageError{fmt.Errorf("%s: %w", fs.Name(), err)}
	}
	if fs.NArg() == 1 && podArg == "" {
		podArg = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	if *output != "table" && *output != "json" {
		return usageError{fmt.Errorf("status: -o %q is not table or json", *output)}
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	s, err := statusFromAgent(ctx, cfg.SocketPath())
	if err != nil {
		// No agent answering: read the store itself, read-only.
		st, oerr := store.Open(cfg.StorePath(), store.Options{ReadOnly: true})
		if errors.Is(oerr, store.ErrLocked) {
			return fmt.Errorf("an agent holds the store but did not answer on %s: %v", cfg.SocketPath(), err)
		}
		if oerr != nil {
			return fmt.Errorf("no agent answered on %s, and the store cannot be read: %w", cfg.SocketPath(), oerr)
		}
		defer st.Close()
		if s, err = agent.ReadStatus(st); err != nil {
			return err
		}
	}
	if podArg != "" {
		ns, name, ok := strings.Cut(podArg, "/")
		if !ok {
			ns, name = "default", podArg
		}
		for _, p := range s.Pods {
			if p.Namespace == ns && p.Name == name {
				if *output == "json" {
					enc := json.NewEncoder(stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(p)
				}
				return printPod(stdout, p)
			}
		}
		return fmt.Errorf("pod %s/%s is not on this node", ns, name)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	return printStatus(stdout, s)
}

func statusFromAgent(ctx context.Context, socket string) (agent.Status, error) {
	var s agent.Status
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return s, fmt.Errorf("agent status: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("agent status: %w", err)
	}
	if s.From == "" {
		return s, errors.New("agent status: empty answer")
	}
	return s, nil
}

func printStatus(w io.Writer, s agent.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	from := "the running agent"
	if s.From == "store" {
		from = "the store file; the agent is not running"
	}
	fmt.Fprintf(tw, "NODE\t%s\t(read from %s)\n", s.Node, from)
	fmt.Fprintf(tw, "STORE\t%s\t%d KiB, schema %d\n", s.Store.Path, (s.Store.Bytes+1023)/1024, s.Store.Schema)
	fmt.Fprintf(tw, "JOURNAL\t%d status updates waiting to be sent\t\n", s.JournalBacklog)
	if a := s.Agent; a != nil {
		fmt.Fprintf(tw, "AGENT\toutpost %s, pid %d, up since %s\t\n", a.Version, a.PID, a.Started.Format(time.RFC3339))
		fmt.Fprintf(tw, "BOARD\t%s\t\n", boardLine(a.Board))
		fmt.Fprintf(tw, "LINK\t%s\t\n", linkLine(a.Link, s.JournalBacklog, time.Now()))
		if a.Proxy != nil {
			fmt.Fprintf(tw, "PROXY\t%s\t\n", proxyLine(a.Proxy, time.Now()))
		}
		if a.Link != nil && a.Link.Certificate != nil {
			fmt.Fprintf(tw, "CERT\t%s\t\n", certLine(a.Link.Certificate))
		}
	}
	tw.Flush()
	if a := s.Agent; a != nil && !a.StoreWrites.Writable && a.StoreWrites.Reason != "" {
		fmt.Fprintf(w, "\nSTORE TAKES NO WRITES (%s, since %s): pods keep running; what changes is kept in memory and written when the disk takes writes again\n  %s\n",
			a.StoreWrites.Reason, a.StoreWrites.Since.Format(time.RFC3339), a.StoreWrites.Message)
	}
	if a := s.Agent; a != nil && len(a.ManifestErrors) > 0 {
		fmt.Fprintln(w, "\nMANIFEST ERRORS (what was recorded from a bad document is kept; a pod with a bad spec is Failed)")
		for _, e := range a.ManifestErrors {
			// One error may name several fields, a line each.
			fmt.Fprintln(w, "  "+strings.ReplaceAll(e, "\n", "\n    "))
		}
	}
	if a := s.Agent; a != nil && a.Link != nil && len(a.Link.MirrorErrors) > 0 {
		fmt.Fprintln(w, "\nNO MIRROR POD (the API server does not show these static pods)")
		for _, e := range a.Link.MirrorErrors {
			fmt.Fprintln(w, "  "+e)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tSOURCE\tPHASE\tREADY\tRESTARTS\tIP\tAGE")
	for _, p := range s.Pods {
		phase, ready, restarts, ip, age := "-", fmt.Sprintf("0/%d", p.Containers), "0", "-", "-"
		if st := p.Status; st != nil {
			phase = podPhase(st)
			n, r := 0, int32(0)
			for _, c := range st.ContainerStatuses {
				if c.Ready {
					n++
				}
				r += c.RestartCount
			}
			ready, restarts = fmt.Sprintf("%d/%d", n, p.Containers), fmt.Sprint(r)
			if st.PodIP != "" {
				ip = st.PodIP
			}
			if st.StartTime != nil {
				age = shortDuration(time.Since(st.StartTime.Time))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, p.Source, phase, ready, restarts, ip, age)
	}
	if len(s.Pods) == 0 {
		fmt.Fprintln(tw, "(no pods)\t\t\t\t\t\t\t")
	}
	tw.Flush()
	if len(s.Services) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tSOURCE\tTYPE\tCLUSTER-IP\tPORTS")
		for _, v := range s.Services {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Namespace, v.Name, v.Source, v.Type, cmp.Or(v.ClusterIP, "<none>"), v.Ports)
		}
		tw.Flush()
	}
	return nil
}

// boardLine is the BOARD line: model, cgroups, hottest zone, throttling
// flags and the memory controller, with how to turn it on when it is off.
func boardLine(f arm.Facts) string {
	model := f.Model
	if model == "" {
		model = "unknown model"
	}
	if r := f.PiRevision; r != nil {
		model += " (" + r.String() + ", " + r.Code + ")"
	}
	parts := []string{model, "cgroup " + f.Cgroup}
	h := f.Health
	if z, ok := h.Hottest(); ok {
		t := fmt.Sprintf("%.1f °C", z.Celsius())
		if z.Type != "" {
			t += " (" + z.Type + ")"
		}
		parts = append(parts, t)
	}
	var now, occurred []string
	if h.Throttle != nil {
		now, occurred = h.Throttle.Now(), h.Throttle.Occurred()
	}
	if h.UnderVoltage() && !slices.Contains(now, "under-voltage") {
		now = append([]string{"under-voltage"}, now...)
	}
	var flags []string
	for _, n := range now {
		flags = append(flags, n+" now")
	}
	for _, n := range occurred {
		if !slices.Contains(now, n) {
			flags = append(flags, n+" occurred")
		}
	}
	switch {
	case len(flags) > 0:
		parts = append(parts, strings.Join(flags, ", "))
	case h.Throttle != nil || h.UnderVoltageAlarm != nil:
		parts = append(parts, "no under-voltage or throttling")
	}
	if err := f.MemoryCgroupError(); err != nil {
		var me *arm.MemoryCgroupError
		errors.As(err, &me)
		parts = append(parts, "memory controller off: "+me.Fix())
	} else {
		parts = append(parts, "memory controller on")
	}
	return strings.Join(parts, ", ")
}

// podPhase is the STATUS column kubectl shows: a waiting or terminated
// container's reason when there is one, else the phase.
func podPhase(st *corev1.PodStatus) string {
	for _, c := range append(append([]corev1.ContainerStatus(nil), st.InitContainerStatuses...), st.ContainerStatuses...) {
		if w := c.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			return w.Reason
		}
	}
	for _, c := range st.ContainerStatuses {
		if t := c.State.Terminated; t != nil && st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed && t.Reason != "" {
			return t.Reason
		}
	}
	if st.Phase == "" {
		return "Pending"
	}
	return string(st.Phase)
}

func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// printPod shows one pod: its status, containers and recent events.
func printPod(w io.Writer, p agent.PodInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "POD\t%s/%s\n", p.Namespace, p.Name)
	fmt.Fprintf(tw, "UID\t%s\n", p.UID)
	fmt.Fprintf(tw, "SOURCE\t%s\n", p.Source)
	st := p.Status
	if st == nil {
		fmt.Fprintf(tw, "STATUS\tnot known yet\n")
		return tw.Flush()
	}
	fmt.Fprintf(tw, "STATUS\t%s\n", podPhase(st))
	if st.Reason != "" {
		fmt.Fprintf(tw, "REASON\t%s\n", st.Reason)
	}
	if st.Message != "" {
		fmt.Fprintf(tw, "MESSAGE\t%s\n", st.Message)
	}
	fmt.Fprintf(tw, "IP\t%s\n", st.PodIP)
	if st.StartTime != nil {
		fmt.Fprintf(tw, "STARTED\t%s\n", st.StartTime.Time.Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "QOS\t%s\n", st.QOSClass)
	var conds []string
	for _, c := range st.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	fmt.Fprintf(tw, "CONDITIONS\t%s\n", strings.Join(conds, " "))
	tw.Flush()
	if len(st.InitContainerStatuses)+len(st.ContainerStatuses) > 0 {
		fmt.Fprintln(w)
		printContainers(w, st)
	}
	if len(p.Events) > 0 {
		fmt.Fprintln(w, "\nEVENTS")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, e := range p.Events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Time.Format(time.RFC3339), e.Type, e.Reason, e.Message)
		}
		tw.Flush()
	}
	return nil
}

// printContainers shows the containers of a pod status, init containers
// first, and the messages of those waiting.
func printContainers(w io.Writer, st *corev1.PodStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tSTATE\tREADY\tRESTARTS\tLAST EXIT\tID")
	row := func(prefix string, c corev1.ContainerStatus) {
		state := "waiting"
		switch {
		case c.State.Running != nil:
			state = "running since " + c.State.Running.StartedAt.Time.Format(time.RFC3339)
		case c.State.Terminated != nil:
			state = fmt.Sprintf("terminated: %s (exit %d)", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
		case c.State.Waiting != nil:
			state = "waiting: " + c.State.Waiting.Reason
		}
		last := "-"
		if t := c.LastTerminationState.Terminated; t != nil {
			last = fmt.Sprintf("%s (exit %d) at %s", t.Reason, t.ExitCode, t.FinishedAt.Time.Format(time.RFC3339))
		}
		id := strings.TrimPrefix(c.ContainerID, "containerd://")
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%v\t%d\t%s\t%s\n", prefix, c.Name, state, c.Ready, c.RestartCount, last, id)
	}
	for _, c := range st.InitContainerStatuses {
		row("init:", c)
	}
	for _, c := range st.ContainerStatuses {
		row("", c)
	}
	tw.Flush()
	for _, c := range append(append([]corev1.ContainerStatus(nil), st.InitContainerStatuses...), st.ContainerStatuses...) {
		if wt := c.State.Waiting; wt != nil && wt.Message != "" {
			fmt.Fprintf(w, "  %s: %s\n", c.Name, wt.Message)
		}
	}
}

// linkLine says whether the agent reaches the API server, since when, when
// it last renewed its Lease and what last failed.
func linkLine(l *report.Link, backlog int, now time.Time) string {
	if l == nil {
		return "standalone (no kubeconfig, no mqtt)"
	}
	ago := func(t time.Time) string { return now.Sub(t).Round(time.Second).String() + " ago" }
	peer := l.Server
	if l.Transport != "" {
		peer = l.Transport + " " + l.Server
	}
	state := "offline since " + l.Since.Format(time.RFC3339)
	if l.Connected {
		state = "connected to " + peer + " since " + l.Since.Format(time.RFC3339)
	} else {
		state = peer + " " + state
	}
	if !l.LastLease.IsZero() {
		state += ", lease renewed " + ago(l.LastLease)
	}
	if !l.LastPublish.IsZero() {
		state += ", last publish " + ago(l.LastPublish)
	}
	if backlog > 0 {
		state += fmt.Sprintf(", %d statuses to send", backlog)
	}
	if l.LastError != "" && (!l.Connected || l.LastErrorAt.After(l.Since)) {
		state += "; last error " + ago(l.LastErrorAt) + ": " + l.LastError
	}
	return state
}

// proxyLine says what the service proxy programmed and how its last sync
// went.
func proxyLine(p *report.Proxy, now time.Time) string {
	if p.Syncs == 0 {
		return "not synced yet"
	}
	line := fmt.Sprintf("%d service ports: %d chains, %d rules, %d map elements", p.Services, p.Chains, p.Rules, p.Elements)
	ago := now.Sub(p.Last).Round(time.Second).String() + " ago"
	if p.LastError != "" {
		return line + "; last sync failed " + ago + ": " + p.LastError
	}
	return line + fmt.Sprintf("; synced %s in %s", ago, p.LastDuration.Round(10*time.Microsecond))
}

// certLine describes the node's bootstrapped client certificate.
func certLine(c *report.Cert) string {
	line := string(c.Phase)
	if c.Subject != "" {
		line += ", " + c.Subject
	}
	if !c.NotAfter.IsZero() {
		line += ", valid until " + c.NotAfter.Format(time.RFC3339)
	}
	if !c.RenewAt.IsZero() && c.Phase == report.CertValid {
		line += ", renewed from " + c.RenewAt.Format(time.RFC3339)
	}
	if c.CSR != "" {
		line += ", request " + c.CSR
	}
	if c.Reason != "" {
		line += ": " + c.Reason
	}
	return line
}
