package nfttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/netnstest"
	"github.com/outpost-edge/outpost/netproxy/nft"
)

// This file compares the kernel's table with the Fake's: a namespace to
// program, the table as nft(8) lists it, and that listing in Dump's form.

// NetNS returns a fresh network namespace (netnstest.New), skipping the
// test when not root or when this kernel (or emulator) has no nftables
// netlink (any other failure fails it): qemu-user (make test-arm) passes
// only route, uevent and audit netlink through to the kernel, and with a
// netns the socket library would then hand nftables a nil connection,
// which panics, so the tests ask first.
func NetNS(t testing.TB) int {
	t.Helper()
	ns := netnstest.New(t)
	if err := nft.Available(); errors.Is(err, unix.EPROTONOSUPPORT) {
		// The one error that means this kernel has no nfnetlink.
		t.Skipf("this kernel has no nftables netlink: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return ns
}

// LineDiff lists the lines only in want (-) and only in got (+), for a
// test's failure message.
func LineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "-"+l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+"+l)
		}
	}
	if len(out) == 0 {
		return "(same lines, other order)\n" + got
	}
	return strings.Join(out, "\n")
}

// ListTable returns `nft list table inet outpost` run in the netns, or
// "" when there is no table; it fails the test when nft or nsenter is
// missing.
func ListTable(t testing.TB, nsfd int) string {
	t.Helper()
	for _, tool := range []string{"nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed: as root the kernel tests need it (`make test` installs it)", tool)
		}
	}
	dup, err := unix.Dup(nsfd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "netns")
	defer f.Close()
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", "nft", "list", "table", "inet", "outpost")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return ""
		}
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return string(out)
}

// Standard priority names nft prints instead of numbers (which ones it
// uses where depends on the nft version).
var priorityNames = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

var priorityRE = regexp.MustCompile(`priority ([a-z]+)(?: ([+-]) (\d+))?;`)

// Normalize makes `nft list table` output comparable with Fake.Dump:
//
//   - a priority name (`dstnat`, `filter - 10`) becomes its number, since
//     nft versions differ in where they print names;
//   - sets and maps, then chains, are sorted by name (nft lists them in
//     the order they were created);
//   - map elements are sorted and printed one a line (nft lists them in
//     the kernel's hash order and wraps lines as it likes).
//
// Everything else (statement wording, the elided `meta nfproto`, `tcp
// dport 80` for `meta l4proto tcp th dport 80`) is Dump's job: it prints
// what nft prints.
func Normalize(s string) string {
	if s == "" {
		return ""
	}
	s = priorityRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := priorityRE.FindStringSubmatch(m)
		p, ok := priorityNames[sub[1]]
		if !ok {
			return m
		}
		if sub[2] != "" {
			n, _ := strconv.Atoi(sub[3])
			if sub[2] == "-" {
				n = -n
			}
			p += n
		}
		return fmt.Sprintf("priority %d;", p)
	})
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "table ") || lines[len(lines)-1] != "}" {
		return s // not a table: compare as is
	}
	type block struct {
		kind, name string
		lines      []string
	}
	var blocks []block
	var cur *block
	for i := 1; i < len(lines)-1; i++ {
		l := lines[i]
		switch {
		case l == "":
		case strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "\t\t") && l != "\t}":
			f := strings.Fields(l) // "set name {"
			blocks = append(blocks, block{kind: f[0], name: f[1]})
			cur = &blocks[len(blocks)-1]
		case strings.HasPrefix(l, "\t\telements = {"):
			// Gather the elements up to the closing brace.
			text := strings.TrimPrefix(l, "\t\telements = {")
			for !strings.HasSuffix(text, "}") && i+1 < len(lines)-1 {
				i++
				text += " " + strings.TrimSpace(lines[i])
			}
			text = strings.TrimSuffix(text, "}")
			var elems []string
			for _, e := range strings.Split(text, ",") {
				elems = append(elems, strings.TrimSpace(e))
			}
			cur.lines = append(cur.lines, strings.TrimSuffix(formatElements(elems), "\n"))
		case l != "\t}":
			cur.lines = append(cur.lines, l)
		}
	}
	rank := func(kind string) int {
		if kind == "chain" {
			return 1
		}
		return 0 // sets and maps
	}
	slices.SortStableFunc(blocks, func(a, b block) int {
		if d := rank(a.kind) - rank(b.kind); d != 0 {
			return d
		}
		return strings.Compare(a.name, b.name)
	})
	var out []string
	for _, b := range blocks {
		text := fmt.Sprintf("\t%s %s {\n", b.kind, b.name)
		for _, l := range b.lines {
			text += l + "\n"
		}
		out = append(out, text+"\t}\n")
	}
	return lines[0] + "\n" + strings.Join(out, "\n") + "}\n"
}

// NFTVersion returns what `nft --version` prints, for failure messages.
func NFTVersion() string {
	out, _ := exec.Command("nft", "--version").Output()
	return strings.TrimSpace(string(out))
}
