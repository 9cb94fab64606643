package packaging

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The tests of scripts/install.sh. They never install on the host: every
// run on the host is a --dry-run, or runs as nobody, and the script's test
// overrides (OUTPOST_INSTALL_ARCH, _MACHINE, _PKG) stand in for other
// boards. The one real install happens in a chroot of a minimal Debian,
// in its own mount and PID namespaces.

// nfpmArch is the nfpm (ARCHES) name of each deb architecture.
var nfpmArch = map[string]string{"arm64": "arm64", "armhf": "arm7", "amd64": "amd64"}

// goPlatform is the Makefile's PLATFORMS entry of each deb architecture.
var goPlatform = map[string]string{"arm64": "linux/arm64", "armhf": "linux/arm", "amd64": "linux/amd64"}

// chosenRE matches the line naming the package install.sh chose.
var chosenRE = regexp.MustCompile(`(?m)^install\.sh: chosen: (\S+) \(version ([^;]+);`)

// installScript returns scripts/install.sh's absolute path.
func installScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../scripts/install.sh")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// scriptEnv is this process's environment without install.sh's test
// overrides, plus env.
func scriptEnv(env ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "OUTPOST_INSTALL_") {
			out = append(out, e)
		}
	}
	return append(out, env...)
}

// exitCode runs cmd and returns its exit status and output.
func exitCode(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return 0, string(out)
}

// dryRun runs install.sh --dry-run ARGS with the env overrides.
func dryRun(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{installScript(t), "--dry-run"}, args...)...)
	cmd.Env = scriptEnv(env...)
	return exitCode(t, cmd)
}

// chosen returns the file install.sh chose and its version.
func chosen(t *testing.T, out string) (file, version string) {
	t.Helper()
	m := chosenRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("install.sh named no chosen package:\n%s", out)
	}
	return m[1], m[2]
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func glob1(t *testing.T, pattern string) string {
	t.Helper()
	m, _ := filepath.Glob(pattern)
	if len(m) != 1 {
		t.Fatalf("want one file matching %s, have %v", pattern, m)
	}
	return m[0]
}

func TestInstallUsage(t *testing.T) {
	needTools(t, "bash")
	for _, c := range []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"help", nil, []string{"--help"}, 0, "usage: install.sh [--dry-run] [DIR|FILE...]"},
		{"unknown option", nil, []string{"--yes"}, 2, "unknown option --yes"},
		{"bad format override", []string{"OUTPOST_INSTALL_PKG=msi"}, []string{"--dry-run"}, 2, "OUTPOST_INSTALL_PKG=msi: want deb or rpm"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("bash", append([]string{installScript(t)}, c.args...)...)
			cmd.Env = scriptEnv(c.env...)
			code, out := exitCode(t, cmd)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, c.code, c.want, out)
			}
		})
	}

	// Not root: refused before anything else, with exit 2; a dry run
	// needs no root. The script is copied out of the checkout, so it
	// looks in the current directory, and nobody can read it there.
	t.Run("not root", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		script := filepath.Join(dir, "install.sh")
		copyFile(t, installScript(t), script)
		asUser := func(args ...string) *exec.Cmd {
			cmd := exec.Command("bash", append([]string{script}, args...)...)
			cmd.Dir = dir
			cmd.Env = scriptEnv("HOME=" + dir)
			if os.Getuid() == 0 {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			return cmd
		}
		code, out := exitCode(t, asUser())
		if code != 2 || !strings.Contains(out, "must run as root") {
			t.Errorf("as uid %d: exit %d, want 2 saying it must run as root:\n%s", 65534, code, out)
		}
		// The directory holds only install.sh: refused, listing it.
		code, out = exitCode(t, asUser("--dry-run"))
		if code != 1 || !strings.Contains(out, dir+": no outpost_*.deb or outpost-*.rpm; it holds: install.sh") {
			t.Errorf("dry run, not root, in a directory without packages: exit %d, want 1 listing install.sh:\n%s", code, out)
		}
	})

	t.Run("no dpkg nor rpm", func(t *testing.T) {
		path := t.TempDir() // PATH holds nothing: no dpkg, rpm, apt-get or dnf
		code, out := dryRun(t, []string{"PATH=" + path}, t.TempDir())
		if code != 1 || !strings.Contains(out, "neither dpkg nor rpm") {
			t.Errorf("exit %d, want 1 saying neither dpkg nor rpm is there:\n%s", code, out)
		}
		code, out = dryRun(t, []string{"PATH=" + path, "OUTPOST_INSTALL_PKG=deb", "OUTPOST_INSTALL_MACHINE=x86_64"}, t.TempDir())
		if code != 1 || !strings.Contains(out, "none of apt-get dpkg is on PATH") {
			t.Errorf("deb without apt-get or dpkg: exit %d, want 1 saying so:\n%s", code, out)
		}
	})
}

func TestInstallShellcheck(t *testing.T) {
	needTools(t, "shellcheck")
	run(t, "../..", "shellcheck", "scripts/install.sh")
}

// TestInstall builds the packages, then has install.sh choose among them
// for each architecture, refuse what does not fit, pick the newest
// version, and install for real in a chroot; there it removes and purges
// (purge_test.go) and upgrades under a running agent (upgrade_test.go),
// and the .rpm is installed, upgraded and erased with rpm --root.
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries and ten packages")
	}
	needTools(t, "make", "go", "bash", "dpkg", "dpkg-deb", "rpm")
	if _, err := os.Stat(filepath.Join(toolsDir(), "bin", "nfpm")); err != nil && os.Getuid() != 0 {
		t.Skipf("nfpm not built in %s/bin: run `make testenv` (as root)", toolsDir())
	}
	dist := t.TempDir()
	run(t, "../..", "make", "--no-print-directory", "packages", "DIST="+dist)

	// versions holds .deb and .rpm packages of 0.1.0~rc.1, 0.1.0 and the
	// working tree's version (0.0.0~git…), for this machine's
	// architecture (amd64 elsewhere), all built by build.sh. Sorted as
	// text, the rc comes last ('~' > '-'); dpkg and rpm sort 0.1.0 last.
	hostArch := strings.TrimSpace(run(t, ".", "dpkg", "--print-architecture"))
	va := "amd64"
	if nfpmArch[hostArch] != "" {
		va = hostArch
	}
	vrpm := ""
	for _, a := range arches {
		if a.deb == va {
			vrpm = a.rpm
		}
	}
	versions := t.TempDir()
	for _, v := range []string{"v0.1.0-rc.1", "v0.1.0"} {
		// Each version's binary says its version, as a release's would:
		// the upgrade with running pods checks which binary runs. Only
		// the link differs from dist's binaries.
		bin := t.TempDir()
		run(t, "../..", "make", "--no-print-directory", "build-all", "DIST="+bin, "VERSION="+v, "PLATFORMS="+goPlatform[va])
		cmd := exec.Command("bash", "scripts/packaging/build.sh", bin)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "VERSION="+v, "OUT="+versions, "ARCHES="+nfpmArch[va])
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s packages: %v\n%s", v, err, out)
		}
	}
	for _, p := range []string{"outpost_*_" + va + ".deb", "outpost-*." + vrpm + ".rpm"} {
		f := glob1(t, filepath.Join(dist, p))
		copyFile(t, f, filepath.Join(versions, filepath.Base(f)))
	}

	t.Run("arch", func(t *testing.T) {
		cases := []struct {
			env  []string
			want string // the chosen file's suffix
		}{
			{[]string{"OUTPOST_INSTALL_ARCH=arm64", "OUTPOST_INSTALL_PKG=deb"}, "_arm64.deb"},
			{[]string{"OUTPOST_INSTALL_ARCH=armhf", "OUTPOST_INSTALL_PKG=deb"}, "_armhf.deb"},
			{[]string{"OUTPOST_INSTALL_ARCH=amd64", "OUTPOST_INSTALL_PKG=deb"}, "_amd64.deb"},
			// Raspberry Pi OS 32-bit on a Pi 4's 64-bit kernel.
			{[]string{"OUTPOST_INSTALL_ARCH=armhf", "OUTPOST_INSTALL_MACHINE=aarch64", "OUTPOST_INSTALL_PKG=deb"}, "_armhf.deb"},
			{[]string{"OUTPOST_INSTALL_ARCH=aarch64", "OUTPOST_INSTALL_PKG=rpm"}, ".aarch64.rpm"},
			{[]string{"OUTPOST_INSTALL_ARCH=armv7hl", "OUTPOST_INSTALL_PKG=rpm"}, ".armv7hl.rpm"},
			{[]string{"OUTPOST_INSTALL_ARCH=x86_64", "OUTPOST_INSTALL_PKG=rpm"}, ".x86_64.rpm"},
			// An rpm system's architecture comes from uname -m.
			{[]string{"OUTPOST_INSTALL_MACHINE=aarch64", "OUTPOST_INSTALL_PKG=rpm"}, ".aarch64.rpm"},
			{[]string{"OUTPOST_INSTALL_MACHINE=armv7l", "OUTPOST_INSTALL_PKG=rpm"}, ".armv7hl.rpm"},
			{[]string{"OUTPOST_INSTALL_MACHINE=x86_64", "OUTPOST_INSTALL_PKG=rpm"}, ".x86_64.rpm"},
		}
		// No override: this machine, as dpkg says.
		if nfpmArch[hostArch] != "" {
			cases = append(cases, struct {
				env  []string
				want string
			}{nil, "_" + hostArch + ".deb"})
		}
		for _, c := range cases {
			name := strings.Join(c.env, ",")
			if name == "" {
				name = "this machine"
			}
			t.Run(name, func(t *testing.T) {
				code, out := dryRun(t, c.env, dist)
				if code != 0 {
					t.Fatalf("exit %d:\n%s", code, out)
				}
				file, _ := chosen(t, out)
				if filepath.Dir(file) != dist || !strings.HasSuffix(file, c.want) {
					t.Errorf("chose %s, want %s/…%s", file, dist, c.want)
				}
				if !strings.Contains(out, "would run: ") || !strings.Contains(out, " "+file+"\n") {
					t.Errorf("no command installing %s:\n%s", file, out)
				}
				if strings.Contains(out, "running: ") {
					t.Errorf("a dry run ran something:\n%s", out)
				}
			})
		}
	})

	t.Run("refusal", func(t *testing.T) {
		deb := func(a string) string { return glob1(t, filepath.Join(dist, "outpost_*_"+a+".deb")) }
		rpmX86 := glob1(t, filepath.Join(dist, "outpost-*.x86_64.rpm"))
		amd64 := []string{"OUTPOST_INSTALL_ARCH=amd64", "OUTPOST_INSTALL_PKG=deb"}

		empty := t.TempDir()
		others := t.TempDir()
		copyFile(t, filepath.Join(dist, "outpost-linux-amd64"), filepath.Join(others, "outpost-linux-amd64"))
		copyFile(t, "../../packaging/README.md", filepath.Join(others, "README.md"))
		arm64Only := t.TempDir()
		copyFile(t, deb("arm64"), filepath.Join(arm64Only, filepath.Base(deb("arm64"))))
		// An arm64 package renamed as an amd64 one: the header decides.
		renamed := t.TempDir()
		lie := filepath.Join(renamed, "outpost_9.9.9-1_amd64.deb")
		copyFile(t, deb("arm64"), lie)
		broken := filepath.Join(t.TempDir(), "outpost_1.0-1_amd64.deb")
		if err := os.WriteFile(broken, []byte("not a package\n"), 0o644); err != nil {
			t.Fatal(err)
		}

		for _, c := range []struct {
			name string
			env  []string
			args []string
			want []string
		}{
			{"armv6l rpm", []string{"OUTPOST_INSTALL_MACHINE=armv6l", "OUTPOST_INSTALL_PKG=rpm"}, []string{dist}, []string{"armv6l", "ARMv7"}},
			{"armhf userland on armv6l", []string{"OUTPOST_INSTALL_ARCH=armhf", "OUTPOST_INSTALL_MACHINE=armv6l", "OUTPOST_INSTALL_PKG=deb"}, []string{dist}, []string{"armv6l", "armhf userland", "ARMv7"}},
			{"armel", []string{"OUTPOST_INSTALL_ARCH=armel", "OUTPOST_INSTALL_PKG=deb"}, []string{dist}, []string{"armel", "ARMv7"}},
			{"riscv64", []string{"OUTPOST_INSTALL_ARCH=riscv64", "OUTPOST_INSTALL_PKG=deb"}, []string{dist}, []string{"riscv64", "not supported"}},
			{"empty dir", amd64, []string{empty}, []string{"no outpost .deb package for amd64 in " + empty, empty + ": empty"}},
			{"dir without packages", amd64, []string{others}, []string{"no outpost_*.deb or outpost-*.rpm; it holds: README.md outpost-linux-amd64"}},
			{"dir of another arch", amd64, []string{arm64Only}, []string{filepath.Base(deb("arm64")) + ": architecture arm64, this machine needs amd64"}},
			{"explicit file of another arch", amd64, []string{deb("arm64")}, []string{deb("arm64") + ": architecture arm64, this machine needs amd64"}},
			{"file named for amd64 holding arm64", amd64, []string{renamed}, []string{lie + ": architecture arm64, this machine needs amd64"}},
			{"rpm on a deb machine", amd64, []string{rpmX86}, []string{rpmX86 + ": a .rpm; this machine installs .deb packages"}},
			{"deb on an rpm machine", []string{"OUTPOST_INSTALL_ARCH=x86_64", "OUTPOST_INSTALL_PKG=rpm"}, []string{deb("amd64")}, []string{"a .deb; this machine installs .rpm packages"}},
			{"not a package", amd64, []string{broken}, []string{broken + ": cannot read it as a .deb package"}},
			{"no such dir", amd64, []string{filepath.Join(empty, "nothere")}, []string{"nothere: no such file or directory"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				code, out := dryRun(t, c.env, c.args...)
				if code != 1 {
					t.Errorf("exit %d, want 1", code)
				}
				for _, w := range c.want {
					if !strings.Contains(out, w) {
						t.Errorf("output lacks %q", w)
					}
				}
				if chosenRE.MatchString(out) || t.Failed() {
					t.Errorf("output:\n%s", out)
				}
			})
		}
	})

	t.Run("newest", func(t *testing.T) {
		var names []string
		entries, _ := os.ReadDir(versions)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if len(names) != 6 {
			t.Fatalf("want 3 versions × 2 formats in %s, have %v", versions, names)
		}
		for _, c := range []struct {
			env     []string
			pattern string
		}{
			{[]string{"OUTPOST_INSTALL_ARCH=" + va, "OUTPOST_INSTALL_PKG=deb"}, "outpost_*.deb"},
			{[]string{"OUTPOST_INSTALL_ARCH=" + vrpm, "OUTPOST_INSTALL_PKG=rpm"}, "outpost-*.rpm"},
		} {
			files, _ := filepath.Glob(filepath.Join(versions, c.pattern))
			slices.Sort(files)
			if strings.Contains(files[len(files)-1], "0.1.0-1") {
				t.Fatalf("%s sorts last as text: the test would not tell a version order from a text one", files[len(files)-1])
			}
			// As a directory, and as files in either order.
			rev := slices.Clone(files)
			slices.Reverse(rev)
			for _, args := range [][]string{{versions}, files, rev} {
				code, out := dryRun(t, c.env, args...)
				if code != 0 {
					t.Fatalf("exit %d:\n%s", code, out)
				}
				file, version := chosen(t, out)
				if version != "0.1.0-1" || !strings.Contains(filepath.Base(file), "0.1.0-1") {
					t.Errorf("%s: chose %s (version %s), want 0.1.0-1:\n%s", c.pattern, file, version, out)
				}
				if n := strings.Count(out, "also fits, not newer: "); n != 2 {
					t.Errorf("%d other packages reported, want 2:\n%s", n, out)
				}
			}
		}
	})

	// The chroot outlives its subtest: the ones after it remove, purge
	// and upgrade there, and run only when it was made.
	root := t.TempDir()
	installed := false
	t.Run("chroot", func(t *testing.T) {
		installInChroot(t, root, dist, versions, hostArch)
		installed = !t.Failed()
	})
	inRoot := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if !installed {
				t.Skip("no chroot with outpost installed: see the chroot subtest")
			}
			f(t)
		})
	}
	inRoot("remove and purge", func(t *testing.T) { removeAndPurge(t, root) })
	inRoot("upgrade with running pods", func(t *testing.T) { upgradeWithPods(t, root) })
	t.Run("rpm", func(t *testing.T) { rpmInRoot(t, versions, hostArch, vrpm) })
}

// installInChroot installs the packages for real with install.sh inside
// root (an empty directory), made a chroot of a minimal Debian of the
// host's release, run in its own mount and PID namespaces (so nothing it
// mounts or starts outlives it): a first
// install that fetches containerd and runc from the archive, an upgrade
// that keeps an edited config, a rerun of the same version, a refused
// downgrade, and the test overrides refused outside a dry run. The host's
// packages, /etc and systemd are never touched; no service is started.
func installInChroot(t *testing.T, root, dist, versions, hostArch string) {
	if os.Getuid() != 0 {
		t.Skip("a real install in a chroot needs root")
	}
	needTools(t, "mmdebstrap", "unshare", "chroot", "tar", "apt-get")
	if nfpmArch[hostArch] == "" {
		t.Skipf("no outpost package for this machine's architecture %s to install", hostArch)
	}
	base := debianBase(t, hostArch)
	run(t, ".", "tar", "-xf", base, "-C", root)
	copyFile(t, "/etc/resolv.conf", filepath.Join(root, "etc/resolv.conf"))
	// Debian's way to say "start no service here", for containerd's postinst.
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	opt := filepath.Join(root, "opt/outpost")
	for _, d := range []string{"dist", "versions"} {
		if err := os.MkdirAll(filepath.Join(opt, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, installScript(t), filepath.Join(opt, "install.sh"))
	for src, dst := range map[string]string{dist: "dist", versions: "versions"} {
		files, _ := filepath.Glob(filepath.Join(src, "outpost*[bm]"))
		for _, f := range files {
			copyFile(t, f, filepath.Join(opt, dst, filepath.Base(f)))
		}
	}
	installed := func() string {
		_, out := inChroot(t, root, `dpkg-query -W -f='${Version} ${db:Status-Status}' outpost`)
		return out
	}

	// First install, from the current directory (the script is outside a
	// checkout): all six packages there, containerd and runc not yet
	// installed, the archive's lists empty.
	code, out := inChroot(t, root, "cd /opt/outpost/dist && bash ../install.sh")
	file, version := chosen(t, out)
	for _, want := range []string{
		"running: apt-get update",
		"outpost " + version + " is installed.",
		"systemctl enable --now outpost",
		"outpost status",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("first install: output lacks %q", want)
		}
	}
	if code != 0 || !strings.HasSuffix(file, "_"+hostArch+".deb") || t.Failed() {
		t.Fatalf("first install: exit %d, chose %s:\n%s", code, file, out)
	}
	if got := installed(); got != version+" installed" {
		t.Errorf("dpkg-query outpost: %q, want %q", got, version+" installed")
	}
	if code, out := inChroot(t, root, "dpkg-query -W containerd runc || dpkg-query -W containerd.io"); code != 0 {
		t.Errorf("the dependencies were not installed: %s", out)
	}
	if code, out := inChroot(t, root, "outpost version"); code != 0 {
		t.Errorf("outpost version in the chroot: exit %d: %s", code, out)
	}
	shipped, _ := os.ReadFile("../../packaging/config.yaml")
	cfg := filepath.Join(root, "etc/outpost/config.yaml")
	if got, _ := os.ReadFile(cfg); string(got) != string(shipped) {
		t.Errorf("/etc/outpost/config.yaml differs from packaging/config.yaml")
	}

	// Upgrade to the newest of versions/, with the config edited on the
	// board: no archive lists needed now, the edit kept.
	edited := string(shipped) + "nodeName: pi-field-017\n"
	if err := os.WriteFile(cfg, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = inChroot(t, root, "bash /opt/outpost/install.sh /opt/outpost/versions")
	if _, v := chosen(t, out); code != 0 || v != "0.1.0-1" || strings.Contains(out, "apt-get update") {
		t.Fatalf("upgrade: exit %d, version %s, want 0 and 0.1.0-1 without apt-get update:\n%s", code, v, out)
	}
	if got := installed(); got != "0.1.0-1 installed" {
		t.Errorf("after the upgrade dpkg-query outpost: %q", got)
	}
	if got, _ := os.ReadFile(cfg); string(got) != edited {
		t.Errorf("the upgrade did not keep the edited /etc/outpost/config.yaml:\n%s", got)
	}

	// The same version again: nothing to do.
	code, out = inChroot(t, root, "bash /opt/outpost/install.sh /opt/outpost/versions")
	if code != 0 || !strings.Contains(out, "outpost 0.1.0-1 is already installed; nothing to do") || strings.Contains(out, "running: ") {
		t.Errorf("rerun: exit %d, want 0, already installed, nothing run:\n%s", code, out)
	}

	// An older one: refused.
	code, out = inChroot(t, root, "bash /opt/outpost/install.sh /opt/outpost/versions/outpost_0.1.0~rc.1-1_*.deb")
	if code != 1 || !strings.Contains(out, "outpost 0.1.0-1 is installed, newer than") || installed() != "0.1.0-1 installed" {
		t.Errorf("downgrade: exit %d, want 1, refused, 0.1.0-1 kept:\n%s", code, out)
	}

	// The test overrides never reach a real install.
	code, out = inChroot(t, root, "OUTPOST_INSTALL_ARCH=arm64 bash /opt/outpost/install.sh /opt/outpost/dist")
	if code != 2 || !strings.Contains(out, "they need --dry-run") || installed() != "0.1.0-1 installed" {
		t.Errorf("overrides without --dry-run: exit %d, want 2:\n%s", code, out)
	}
}

// inChroot runs the bash script in root, in new mount and PID namespaces
// with the chroot's own /proc, with a clean environment.
func inChroot(t *testing.T, root, script string) (int, string) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--pid", "--fork", "--mount-proc="+filepath.Join(root, "proc"),
		"chroot", root, "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C.UTF-8",
		"/bin/bash", "-c", script)
	return exitCode(t, cmd)
}

// debianBase returns a tarball of a minimal Debian (mmdebstrap's apt
// variant) of the host's release and architecture, from the host's apt
// sources. It is made on first use (a few minutes) and kept in the tool
// cache, as nfpm is; each test extracts its own copy.
func debianBase(t *testing.T, arch string) string {
	t.Helper()
	codename := ""
	f, err := os.Open("/etc/os-release")
	if err != nil {
		t.Skipf("no /etc/os-release to name the release of the chroot: %v", err)
	}
	defer f.Close()
	for s := bufio.NewScanner(f); s.Scan(); {
		if v, ok := strings.CutPrefix(s.Text(), "VERSION_CODENAME="); ok {
			codename = strings.Trim(v, `"`)
		}
	}
	if codename == "" {
		t.Skip("/etc/os-release names no VERSION_CODENAME for the chroot")
	}
	dir := filepath.Join(toolsDir(), "chroot")
	path := filepath.Join(dir, codename+"-"+arch+".tar")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	var sources []string
	if b, err := os.ReadFile("/etc/apt/sources.list"); err == nil && regexp.MustCompile(`(?m)^\s*deb\s`).Match(b) {
		sources = append(sources, "/etc/apt/sources.list")
	}
	for _, p := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join("/etc/apt/sources.list.d", p))
		sources = append(sources, m...)
	}
	if len(sources) == 0 {
		t.Skip("the host has no apt sources to make the chroot from")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s-%s-%d.tar", codename, arch, os.Getpid()))
	defer os.Remove(tmp)
	t.Logf("making %s with mmdebstrap (once)", path)
	run(t, ".", "mmdebstrap", append([]string{"--variant=apt", "--quiet", "--architectures=" + arch, codename, tmp}, sources...)...)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}
