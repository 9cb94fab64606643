// Package packaging tests the .deb and .rpm packages `make packages`
// builds: their files, modes, conffiles, unit, dependencies, maintainer
// scripts and architectures, and lintian's verdict on the .deb.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// arches maps each package's nfpm architecture to its deb and rpm names.
var arches = []struct{ deb, rpm string }{
	{"arm64", "aarch64"},
	{"armhf", "armv7hl"},
	{"amd64", "x86_64"},
}

// justifiedWarnings are the lintian warnings packaging/README.md
// justifies; any other warning fails the test.
var justifiedWarnings = []string{
	"initial-upload-closes-no-bugs",
	"maintainer-script-calls-systemctl",
	"no-manual-page",
	"non-standard-dir-perm",
	"unknown-field",
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// needTools skips the test when a command it runs is missing.
func needTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not found: run `make testenv` (as root) to install it", n)
		}
	}
}

// toolsDir is where scripts/packaging/tools.sh keeps nfpm.
func toolsDir() string {
	if d := os.Getenv("OUTPOST_TOOLS"); d != "" {
		return d
	}
	return "/var/cache/outpost-testenv"
}

func TestVersionsSortInBuildOrder(t *testing.T) {
	needTools(t, "bash", "dpkg")
	// Each describe string is a later build than the one before it.
	describes := []string{
		"dev",
		"0123abc",
		"0123abc-dirty",
		"v0.1.0-rc.1",
		"v0.1.0-rc.1-3-g0123abc",
		"v0.1.0",
		"v0.1.0-dirty",
		"v0.1.0-1-g0123abc",
		"v0.1.0-12-g0123abc",
		"v0.1.0-12-g0123abc-dirty",
		"v0.1.1",
	}
	var prev string
	for _, d := range describes {
		v := strings.TrimSpace(run(t, "../..", "bash", "scripts/packaging/build.sh", "--print-version", d))
		if prev != "" {
			if err := exec.Command("dpkg", "--compare-versions", prev, "lt", v).Run(); err != nil {
				t.Errorf("%s gives %s, which does not sort after %s", d, v, prev)
			}
		}
		prev = v
	}
}

func TestPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries and six packages")
	}
	needTools(t, "make", "go", "dpkg-deb", "rpm", "lintian")
	if _, err := os.Stat(filepath.Join(toolsDir(), "bin", "nfpm")); err != nil && os.Getuid() != 0 {
		t.Skipf("nfpm not built in %s/bin: run `make testenv` (as root)", toolsDir())
	}
	dist := t.TempDir()
	run(t, "../..", "make", "--no-print-directory", "packages", "DIST="+dist)

	for _, a := range arches {
		t.Run("deb/"+a.deb, func(t *testing.T) {
			debs, _ := filepath.Glob(filepath.Join(dist, "outpost_*-1_"+a.deb+".deb"))
			if len(debs) != 1 {
				t.Fatalf("want one outpost_*_%s.deb in %s, have %v", a.deb, dist, debs)
			}
			checkDeb(t, debs[0], a.deb)
		})
		t.Run("rpm/"+a.rpm, func(t *testing.T) {
			rpms, _ := filepath.Glob(filepath.Join(dist, "outpost-*-1."+a.rpm+".rpm"))
			if len(rpms) != 1 {
				t.Fatalf("want one outpost-*.%s.rpm in %s, have %v", a.rpm, dist, rpms)
			}
			checkRPM(t, rpms[0], a.rpm)
		})
	}
	t.Run("lintian", func(t *testing.T) {
		debs, _ := filepath.Glob(filepath.Join(dist, "outpost_*_amd64.deb"))
		if len(debs) != 1 {
			t.Fatalf("no amd64 .deb in %s", dist)
		}
		// lintian exits 0 with warnings; errors make it exit non-zero,
		// which is reported with its output below.
		out, _ := exec.Command("lintian", "--no-tag-display-limit", debs[0]).CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			tag, ok := lintianTag(line, "E: ")
			if ok {
				t.Errorf("lintian error: %s", line)
			}
			if tag, ok = lintianTag(line, "W: "); ok && !slices.Contains(justifiedWarnings, tag) {
				t.Errorf("lintian warning not justified in packaging/README.md: %s", line)
			}
		}
	})
}

// lintianTag returns the tag of a lintian output line of the given kind
// ("E: ", "W: ").
func lintianTag(line, kind string) (string, bool) {
	rest, ok := strings.CutPrefix(line, kind+"outpost: ")
	if !ok {
		return "", false
	}
	tag, _, _ := strings.Cut(rest, " ")
	return tag, true
}

// wantFiles are the package's files and directories with their modes
// (as `ls -l` shows them) and the deb and rpm paths of the unit.
var wantFiles = map[string]string{
	"/usr/bin/outpost":                            "-rwxr-xr-x",
	"/usr/bin/containerd-shim-outpost-v2":         "-rwxr-xr-x",
	"/etc/outpost/config.yaml":                    "-rw-r--r--",
	"/etc/outpost/manifests":                      "drwxr-xr-x",
	"/var/lib/outpost":                            "drwx------",
	"/usr/share/outpost/config.yaml":              "-rw-r--r--",
	"/usr/share/outpost/rbac.yaml":                "-rw-r--r--",
	"/usr/share/outpost/mosquitto/mosquitto.conf": "-rw-r--r--",
	"/usr/share/outpost/mosquitto/acl":            "-rw-r--r--",
	"/usr/share/outpost/bridge/rbac.yaml":         "-rw-r--r--",
	"/usr/share/outpost/bridge/deployment.yaml":   "-rw-r--r--",
	"/usr/lib/modules-load.d/outpost.conf":        "-rw-r--r--",
}

func checkDeb(t *testing.T, deb, arch string) {
	fields := map[string]string{}
	for _, f := range []string{"Package", "Architecture", "Depends", "Version", "Maintainer"} {
		fields[f] = strings.TrimSpace(run(t, ".", "dpkg-deb", "-f", deb, f))
	}
	if fields["Package"] != "outpost" || fields["Architecture"] != arch {
		t.Errorf("Package %q Architecture %q, want outpost %s", fields["Package"], fields["Architecture"], arch)
	}
	if want := "containerd | containerd.io, runc | containerd.io"; fields["Depends"] != want {
		t.Errorf("Depends: %q, want %q", fields["Depends"], want)
	}
	if !strings.HasSuffix(filepath.Base(deb), "_"+fields["Version"]+"_"+arch+".deb") {
		t.Errorf("file name %s does not carry version %s", filepath.Base(deb), fields["Version"])
	}

	modes := map[string]string{}
	for _, line := range strings.Split(run(t, ".", "dpkg-deb", "-c", deb), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(f[len(f)-1], "."), "/")
		modes[name] = f[0]
		if f[1] != "root/root" {
			t.Errorf("%s owned by %s, want root/root", name, f[1])
		}
	}
	want := map[string]string{
		"/lib/systemd/system/outpost.service":        "-rw-r--r--",
		"/usr/share/doc/outpost/copyright":           "-rw-r--r--",
		"/usr/share/doc/outpost/changelog.Debian.gz": "-rw-r--r--",
		"/usr/share/lintian/overrides/outpost":       "-rw-r--r--",
	}
	for k, v := range wantFiles {
		want[k] = v
	}
	for name, mode := range want {
		if modes[name] != mode {
			t.Errorf("%s: mode %q, want %q", name, modes[name], mode)
		}
	}

	ctrl := t.TempDir()
	run(t, ".", "dpkg-deb", "-e", deb, ctrl)
	conffiles, _ := os.ReadFile(filepath.Join(ctrl, "conffiles"))
	if strings.TrimSpace(string(conffiles)) != "/etc/outpost/config.yaml" {
		t.Errorf("conffiles: %q, want /etc/outpost/config.yaml", conffiles)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		if _, err := os.Stat(filepath.Join(ctrl, s)); err != nil {
			t.Errorf("no %s script: %v", s, err)
		}
	}

	root := t.TempDir()
	run(t, ".", "dpkg-deb", "-x", deb, root)
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/outpost.service"))
	if err != nil {
		t.Fatal(err)
	}
	checkUnit(t, string(unit))
	shipped, _ := os.ReadFile("../../packaging/config.yaml")
	for _, p := range []string{"etc/outpost/config.yaml", "usr/share/outpost/config.yaml"} {
		got, _ := os.ReadFile(filepath.Join(root, p))
		if string(got) != string(shipped) {
			t.Errorf("/%s differs from packaging/config.yaml", p)
		}
	}
}

// checkUnit checks the settings packaging/README.md promises.
func checkUnit(t *testing.T, unit string) {
	t.Helper()
	lines := strings.Split(unit, "\n")
	for _, want := range []string{
		"Type=notify",
		"WatchdogSec=60s",
		"Restart=always",
		"KillMode=process",
		"ExecStart=/usr/bin/outpost agent --config /etc/outpost/config.yaml",
		"Wants=containerd.service",
		"WantedBy=multi-user.target",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Environment=GOMEMLIMIT=") }) {
		t.Error("unit does not set GOMEMLIMIT")
	}
	// Each of these gives the agent a private mount namespace, so the
	// network namespaces and volumes it mounts would be invisible to
	// containerd; SystemCallArchitectures=native breaks the armhf
	// binary on a 64-bit kernel.
	for _, bad := range []string{"PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices",
		"ProtectKernelTunables", "ProtectControlGroups", "MountFlags", "ReadWritePaths",
		"ReadOnlyPaths", "ProtectHostname", "PrivateMounts", "SystemCallArchitectures", "Requires=containerd"} {
		for _, l := range lines {
			if strings.HasPrefix(l, bad) {
				t.Errorf("unit sets %q: see packaging/README.md", l)
			}
		}
	}
}

func checkRPM(t *testing.T, file, arch string) {
	q := func(format string) string {
		return strings.TrimSpace(run(t, ".", "rpm", "-qp", "--qf", format, file))
	}
	if got := q("%{NAME} %{ARCH} %{RELEASE} %{LICENSE}"); got != "outpost "+arch+" 1 LicenseRef-outpost" {
		t.Errorf("name arch release license: %q", got)
	}
	if got := q("%{VERSION}-%{RELEASE}"); !strings.HasSuffix(filepath.Base(file), "-"+got+"."+arch+".rpm") {
		t.Errorf("file name %s does not carry version %s", filepath.Base(file), got)
	}
	for _, h := range []string{"%{SUMMARY}", "%{URL}", "%{PACKAGER}", "%{DESCRIPTION}"} {
		if v := q(h); v == "" || v == "(none)" {
			t.Errorf("rpm header %s is empty", h)
		}
	}
	requires := run(t, ".", "rpm", "-qp", "--requires", file)
	for _, want := range []string{"(containerd or containerd.io)", "(runc or containerd.io)"} {
		if !strings.Contains(requires, want) {
			t.Errorf("requires lacks %s:\n%s", want, requires)
		}
	}
	if got := strings.TrimSpace(run(t, ".", "rpm", "-qp", "--configfiles", file)); got != "/etc/outpost/config.yaml" {
		t.Errorf("config files: %q", got)
	}
	modes := map[string]string{}
	for _, line := range strings.Split(run(t, ".", "rpm", "-qlvp", file), "\n") {
		f := strings.Fields(line)
		if len(f) >= 9 {
			modes[f[len(f)-1]] = f[0]
		}
	}
	want := map[string]string{"/usr/lib/systemd/system/outpost.service": "-rw-r--r--"}
	for k, v := range wantFiles {
		want[k] = v
	}
	for name, mode := range want {
		if modes[name] != mode {
			t.Errorf("%s: mode %q, want %q", name, modes[name], mode)
		}
	}
	// rpm runs the old package's %preun and %postun on an upgrade too,
	// with $1 >= 1; only $1 = 0 is a removal.
	scripts := run(t, ".", "rpm", "-qp", "--scripts", file)
	for _, want := range []string{"preuninstall scriptlet", "postuninstall scriptlet", "postinstall scriptlet", "remove | 0)"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("scripts lack %q", want)
		}
	}
}
