package packaging

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// What removing the package leaves behind: with dpkg in the chroot
// TestInstall made, and with rpm in a root of its own. packaging/README.md
// ("Removing") promises the same.

// storeFile stands for the store the agent writes in /var/lib/outpost
// (store.FileName): removal and purge keep it.
const storeFile = "var/lib/outpost/outpost.db"

// rpmUnownedDirs are directories the .rpm puts files in without owning
// them, so erasing it leaves them behind, empty. packaging/nfpm.yaml gives
// the package's own directories `type: dir` entries for rpm, so none.
var rpmUnownedDirs []string

// scriptTrouble matches what dpkg and rpm print when a maintainer script
// fails or runs a command that is not there.
var scriptTrouble = regexp.MustCompile(`(?i)\berror\b|scriptlet failed|not found|no such file`)

// dpkgOK runs a dpkg command line in the chroot and fails t unless it
// exits 0 with no sign of a failing maintainer script.
func dpkgOK(t *testing.T, root, script string) string {
	t.Helper()
	code, out := inChroot(t, root, script)
	if code != 0 || scriptTrouble.MatchString(out) {
		t.Fatalf("%s: exit %d:\n%s", script, code, out)
	}
	return out
}

// dpkgState returns dpkg's status abbreviation and version of outpost in
// the chroot ("ii 0.1.0-1"), or "" when dpkg knows nothing of it.
func dpkgState(t *testing.T, root string) string {
	t.Helper()
	code, out := inChroot(t, root, `dpkg-query -W -f='${db:Status-Abbrev}${Version}' outpost 2>/dev/null`)
	if code != 0 {
		return ""
	}
	return out
}

// checkForgotten fails t unless dpkg in the chroot has forgotten outpost:
// not installed, nothing of it in /var/lib/dpkg/info.
func checkForgotten(t *testing.T, root string) {
	t.Helper()
	if code, out := inChroot(t, root, "dpkg -s outpost"); code == 0 || !strings.Contains(out, "is not installed") {
		t.Errorf("dpkg -s outpost after the purge: exit %d, want 1, not installed:\n%s", code, out)
	}
	if left, _ := filepath.Glob(filepath.Join(root, "var/lib/dpkg/info/outpost.*")); len(left) > 0 {
		t.Errorf("dpkg state left after the purge: %v", left)
	}
}

// checkStore fails t unless the store is still in /var/lib/outpost, and
// the directory still 0700.
func checkStore(t *testing.T, root, after string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, storeFile)); err != nil {
		t.Errorf("%s: the store is gone: %v", after, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "var/lib/outpost")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: /var/lib/outpost: %v, want a directory of mode 0700 (%v)", after, fi.Mode(), err)
	}
}

// checkLeft fails t unless, of the package's own paths, exactly those in
// kept are still in root.
func checkLeft(t *testing.T, root string, own []string, kept map[string]bool, after string) {
	t.Helper()
	for _, p := range own {
		_, err := os.Lstat(filepath.Join(root, p))
		if there := err == nil; there != kept[p] {
			t.Errorf("%s: %s is there: %v, want %v", after, p, there, kept[p])
		}
	}
}

// tree returns every path below root, relative to it, but /proc's.
func tree(t *testing.T, root string) map[string]bool {
	t.Helper()
	paths := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "proc" {
			return filepath.SkipDir
		}
		if rel != "." {
			paths[rel] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// treeDiff returns, sorted, the paths after has and before has not, and
// those before has and after has not.
func treeDiff(before, after map[string]bool) (added, removed []string) {
	for p := range after {
		if !before[p] {
			added = append(added, p)
		}
	}
	for p := range before {
		if !after[p] {
			removed = append(removed, p)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	return added, removed
}

// removeAndPurge removes, then purges, the package installInChroot left in
// root (0.1.0-1, its config edited), with no systemd there, as in an
// image build; then installs it again and purges it at once, with a
// manifest the admin added. Removal keeps the conffile; purge removes it,
// with dpkg's backups of it and /etc/outpost, and dpkg forgets the
// package; the store in /var/lib/outpost stays throughout, and so does
// the admin's manifest.
func removeAndPurge(t *testing.T, root string) {
	if got := dpkgState(t, root); got != "ii 0.1.0-1" {
		t.Fatalf("dpkg state of outpost %q, want ii 0.1.0-1 (the chroot subtest's upgrade)", got)
	}
	cfg := filepath.Join(root, "etc/outpost/config.yaml")
	edited, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The package's own paths, as dpkg installed them: not /usr or /etc.
	list, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info/outpost.list"))
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, p := range strings.Fields(string(list)) {
		if strings.Contains(p, "outpost") {
			own = append(own, p)
		}
	}
	for p := range wantFiles {
		if !slices.Contains(own, p) {
			t.Fatalf("dpkg's list of outpost's files lacks %s:\n%s", p, list)
		}
	}
	if err := os.WriteFile(filepath.Join(root, storeFile), []byte("the node's store\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	dpkgOK(t, root, "dpkg --remove outpost")
	if got := dpkgState(t, root); got != "rc 0.1.0-1" {
		t.Errorf("after dpkg --remove: dpkg state %q, want rc 0.1.0-1 (config files only)", got)
	}
	checkLeft(t, root, own, map[string]bool{"/etc/outpost": true, "/etc/outpost/config.yaml": true, "/var/lib/outpost": true}, "dpkg --remove")
	if got, _ := os.ReadFile(cfg); !bytes.Equal(got, edited) {
		t.Errorf("dpkg --remove did not keep the edited /etc/outpost/config.yaml:\n%s", got)
	}
	checkStore(t, root, "dpkg --remove")

	// The backup dpkg keeps when the admin takes the package's version of
	// an edited conffile at a prompt goes with the conffile.
	if err := os.WriteFile(cfg+".dpkg-old", edited, 0o644); err != nil {
		t.Fatal(err)
	}
	dpkgOK(t, root, "dpkg --purge outpost")
	checkForgotten(t, root)
	checkLeft(t, root, own, map[string]bool{"/var/lib/outpost": true}, "dpkg --purge")
	if _, err := os.Lstat(filepath.Join(root, "etc/outpost")); err == nil {
		t.Errorf("dpkg --purge left /etc/outpost")
	}
	checkStore(t, root, "dpkg --purge")

	// Installed again over the kept store, then purged at once, with a
	// manifest the admin added: that manifest (and its directories) and
	// the store are all that is left.
	before := tree(t, root)
	dpkgOK(t, root, "dpkg -i /opt/outpost/versions/outpost_0.1.0~rc.1-1_*.deb")
	if got := dpkgState(t, root); got != "ii 0.1.0~rc.1-1" {
		t.Fatalf("after dpkg -i: dpkg state %q, want ii 0.1.0~rc.1-1", got)
	}
	checkStore(t, root, "dpkg -i over the kept store")
	if err := os.WriteFile(filepath.Join(root, "etc/outpost/manifests/web.yaml"), []byte("apiVersion: v1\nkind: Pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := dpkgOK(t, root, "dpkg --purge outpost")
	if !strings.Contains(out, "directory '/etc/outpost/manifests' not empty so not removed") {
		t.Errorf("dpkg --purge did not say it kept /etc/outpost/manifests:\n%s", out)
	}
	checkForgotten(t, root)
	added, removed := treeDiff(before, tree(t, root))
	if want := []string{"etc/outpost", "etc/outpost/manifests", "etc/outpost/manifests/web.yaml"}; !slices.Equal(added, want) || len(removed) > 0 {
		t.Errorf("install then purge with a manifest added: added %v, removed %v; want added %v, nothing removed", added, removed, want)
	}
	checkStore(t, root, "the second purge")

	// Cleaned up by hand, as packaging/README.md says.
	for _, p := range []string{"etc/outpost", "var/lib/outpost"} {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
}

// rpmInRoot installs, upgrades and erases the .rpm packages of versions
// with the host's rpm (--root, its database in the root) in a fresh root
// of the minimal Debian. There is no rpm-based root here, but rpm runs the
// scriptlets chrooted there, under its /bin/sh, with no systemd, as in an
// image build; containerd and runc are not rpm packages there
// (--nodeps). rpm has no purge: erasing removes the package's files and
// its config when unedited, keeps an edited config as
// config.yaml.rpmsave, and keeps the store.
func rpmInRoot(t *testing.T, versions, hostArch, arch string) {
	if os.Getuid() != 0 {
		t.Skip("rpm --root needs root: it chroots to run the scriptlets")
	}
	needTools(t, "rpm", "mmdebstrap", "tar")
	root := t.TempDir()
	run(t, ".", "tar", "-xf", debianBase(t, hostArch), "-C", root)
	common := []string{"--root", root, "--dbpath", "/var/lib/rpm"}
	// Debian's rpm warns on installs and erasures without it; rpmdb
	// (--initdb) does not know it.
	force := false
	if help, _ := exec.Command("rpm", "--help").CombinedOutput(); bytes.Contains(help, []byte("--force-debian")) {
		force = true
	}
	rpm := func(args ...string) (int, string) {
		a := slices.Clone(common)
		if force && slices.ContainsFunc(args, func(s string) bool { return s == "-i" || s == "-U" || s == "-e" }) {
			a = append(a, "--force-debian")
		}
		return exitCode(t, exec.Command("rpm", append(a, args...)...))
	}
	rpmOK := func(args ...string) string {
		t.Helper()
		code, out := rpm(args...)
		if code != 0 || scriptTrouble.MatchString(out) {
			t.Fatalf("rpm %s: exit %d:\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
	erased := func(after string) {
		t.Helper()
		if code, out := rpm("-q", "outpost"); code == 0 || !strings.Contains(out, "not installed") {
			t.Errorf("%s: rpm -q outpost: exit %d:\n%s", after, code, out)
		}
	}
	old := filepath.Join(versions, "outpost-0.1.0~rc.1-1."+arch+".rpm")
	newer := filepath.Join(versions, "outpost-0.1.0-1."+arch+".rpm")
	rpmOK("--initdb")
	// systemd's, on an rpm system: not the package's to own or remove.
	if err := os.MkdirAll(filepath.Join(root, "usr/lib/modules-load.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := tree(t, root)

	// Installed and erased untouched: nothing is left but the
	// directories the package does not own.
	rpmOK("-i", "--nodeps", newer)
	for p := range wantFiles {
		if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
			t.Errorf("after rpm -i: %v", err)
		}
	}
	rpmOK("-e", "outpost")
	erased("rpm -e")
	added, removed := treeDiff(before, tree(t, root))
	if !slices.Equal(added, rpmUnownedDirs) || len(removed) > 0 {
		t.Errorf("rpm -i, rpm -e: added %v, removed %v; want added %v (not owned), nothing removed", added, removed, rpmUnownedDirs)
	}

	// Installed, configured, run (a store), upgraded: the old package's
	// %preun and %postun run with $1 = 1 and must not fail; the edited
	// config is kept. Erased: it is kept as .rpmsave, with the store.
	rpmOK("-i", "--nodeps", old)
	cfg := filepath.Join(root, "etc/outpost/config.yaml")
	shipped, _ := os.ReadFile(cfg)
	edited := append(shipped, "nodeName: pi-field-017\n"...)
	if err := os.WriteFile(cfg, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, storeFile), []byte("the node's store\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rpmOK("-U", "--nodeps", newer)
	if _, out := rpm("-q", "--qf", "%{VERSION}-%{RELEASE}", "outpost"); out != "0.1.0-1" {
		t.Errorf("after rpm -U: rpm -q outpost: %q, want 0.1.0-1", out)
	}
	if got, _ := os.ReadFile(cfg); !bytes.Equal(got, edited) {
		t.Errorf("rpm -U did not keep the edited /etc/outpost/config.yaml:\n%s", got)
	}
	out := rpmOK("-e", "outpost")
	if !strings.Contains(out, "/etc/outpost/config.yaml saved as /etc/outpost/config.yaml.rpmsave") {
		t.Errorf("rpm -e did not say it kept the edited config:\n%s", out)
	}
	erased("rpm -U, rpm -e")
	if got, _ := os.ReadFile(cfg + ".rpmsave"); !bytes.Equal(got, edited) {
		t.Errorf("config.yaml.rpmsave is not the edited config:\n%s", got)
	}
	checkStore(t, root, "rpm -e")
	added, removed = treeDiff(before, tree(t, root))
	// /etc/outpost stays, holding the .rpmsave.
	want := append(slices.Clone(rpmUnownedDirs), "etc/outpost", "etc/outpost/config.yaml.rpmsave", "var/lib/outpost", storeFile)
	want = slices.Compact(slices.Sorted(slices.Values(want)))
	if !slices.Equal(added, want) || len(removed) > 0 {
		t.Errorf("rpm -i, -U, -e: added %v, removed %v; want added %v, nothing removed", added, removed, want)
	}
}
