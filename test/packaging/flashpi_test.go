package packaging

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/internal/waittest"
)

// The tests below run scripts/flash-pi.sh on synthetic Raspberry Pi OS
// images: an MBR table, a FAT boot partition with cmdline.txt and
// config.txt, and an ext4 root with just enough of Pi OS in it. The FAT
// partition is written and read with mtools, as the script does, so the
// host needs no vfat kernel module.

// piCmdline is Raspberry Pi OS bookworm's cmdline.txt, as its images ship.
const piCmdline = "console=serial0,115200 console=tty1 root=PARTUUID=6c1e2a3b-02 rootfstype=ext4 fsck.repair=yes rootwait"

const piConfigTxt = "# For more options and information see\n# http://rptl.io/configtxt\ndtparam=audio=on\ncamera_auto_detect=1\ndisplay_auto_detect=1\nauto_initramfs=1\ndtoverlay=vc4-kms-v3d\nmax_framebuffers=2\narm_64bit=1\n\n[all]\n"

const piHosts = "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\nff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n\n127.0.1.1\t\traspberrypi\n"

// Raspberry Pi OS bookworm (64-bit) ships Debian's os-release.
const piOSRelease = `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
`

const piPasswd = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
sshd:x:104:65534::/run/sshd:/usr/sbin/nologin
pi:x:1000:1000:,,,:/home/pi:/bin/bash
`

const (
	testKey  = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHq3Lb9bVtD3p2wz9Kq1Xy0oTq5pE3u3Wc3Jm6zQe0aB admin@laptop"
	otherKey = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 old@host"
)

// piImage describes a synthetic image.
type piImage struct {
	parts    int         // partitions: 2, or 1 for a broken image
	bootFS   string      // file system of partition 1: vfat, or ext4 for a broken image
	cmdline  string      // cmdline.txt; empty for none
	merged   bool        // /bin, /sbin and /lib link into /usr, as on Pi OS
	machine  elf.Machine // of ls
	piUser   bool        // a pi user with uid 1000
	hosts    string      // /etc/hosts
	rootKeys string      // /root/.ssh/authorized_keys; empty for none
	dpkg     string      // /var/lib/dpkg/status
	units    bool        // /etc/systemd/system exists
	rootMiB  int         // size of partition 2; 0 for the rest of the image
	osID     string      // ID= of /etc/os-release: "" for Pi OS's, "-" for no file
}

// flashEnv is what every flash-pi.sh run needs: the packages, the host's
// outpost for `config check`, and the inputs.
type flashEnv struct {
	repo    string
	deb     string // the arm64 package
	payload string // deb unpacked
	outpost string // host binary
	config  string
	mfests  string
	images  string
	key     string
	tmpdir  string // TMPDIR of the script: must be empty after each run
}

func TestFlashPiShellcheck(t *testing.T) {
	needTools(t, "shellcheck")
	run(t, "../..", "shellcheck", "scripts/flash-pi.sh")
}

func TestFlashPi(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: flash-pi.sh attaches loop devices and mounts")
	}
	if testing.Short() {
		t.Skip("-short: builds two binaries and a package")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Fatal("losetup not found (util-linux)")
	}
	probeLoop(t)
	for _, tool := range []string{"go", "bash", "partx", "blkid", "sfdisk", "mkfs.vfat", "mkfs.ext4",
		"e2fsck", "mcopy", "mtype", "mdir", "dpkg-deb", "truncate", "mountpoint"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run `make testenv` (scripts/testenv/install.sh)", tool)
		}
	}
	e := newFlashEnv(t)

	t.Run("Install", func(t *testing.T) { testFlashInstall(t, e) })
	t.Run("Variant", func(t *testing.T) { testFlashVariant(t, e) })
	t.Run("Refusals", func(t *testing.T) { testFlashRefusals(t, e) })
	t.Run("Signal", func(t *testing.T) { testFlashSignal(t, e) })
}

// probeLoop skips when this machine cannot attach a loop device (a
// container without /dev/loop-control, say).
func probeLoop(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop device support: %v", err)
	}
	f := filepath.Join(t.TempDir(), "probe.img")
	if err := os.WriteFile(f, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", f).CombinedOutput()
	if err != nil {
		t.Skipf("cannot attach a loop device: %v: %s", err, out)
	}
	run(t, ".", "losetup", "-d", strings.TrimSpace(string(out)))
}

func newFlashEnv(t *testing.T) *flashEnv {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := &flashEnv{repo: repo, outpost: filepath.Join(dir, "outpost")}

	// The host's outpost, for config check; the arm64 one for the package,
	// built as make build-all does.
	run(t, repo, "go", "build", "-tags", "grpcnotrace", "-o", e.outpost, "./cmd/outpost")
	dist := filepath.Join(dir, "dist")
	cmd := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags", "-s -w",
		"-o", filepath.Join(dist, "outpost-linux-arm64"), "./cmd/outpost")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build linux/arm64: %v\n%s", err, out)
	}
	cmd = exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w",
		"-o", filepath.Join(dist, "containerd-shim-outpost-v2-linux-arm64"), "./cmd/containerd-shim-outpost-v2")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build linux/arm64: %v\n%s", err, out)
	}
	cmd = exec.Command("bash", "scripts/packaging/build.sh", dist)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "ARCHES=arm64", "FORMATS=deb", "OUT="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "outpost_*_arm64.deb"))
	if len(debs) != 1 {
		t.Fatalf("want one arm64 .deb in %s, have %v", dist, debs)
	}
	e.deb = debs[0]
	e.payload = filepath.Join(dir, "payload")
	run(t, ".", "dpkg-deb", "-x", e.deb, e.payload)

	e.config = putFile(t, dir, "config.yaml", "nodeName: node-1\nlog:\n  level: debug\n")
	e.mfests = filepath.Join(dir, "manifests")
	putFile(t, e.mfests, "web.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    image: nginx\n")
	putFile(t, e.mfests, "notes.txt", "not a manifest\n")
	e.images = filepath.Join(dir, "images")
	tarball := make([]byte, 64<<10)
	rand.Read(tarball)
	putFile(t, e.images, "app.tar", string(tarball))
	putFile(t, e.images, "README", "not a tarball\n")
	e.key = putFile(t, dir, "id_ed25519.pub", testKey+"\n")
	e.tmpdir = filepath.Join(dir, "tmp")
	if err := os.Mkdir(e.tmpdir, 0o700); err != nil {
		t.Fatal(err)
	}
	return e
}

// flash runs flash-pi.sh on img and returns its output and exit code.
// After every run, failed or not, the loop devices on img must be those
// before it (none but the test's own) and the script's temporary
// directory must be gone.
func (e *flashEnv) flash(t *testing.T, img string, env []string, args ...string) (string, int) {
	t.Helper()
	before := loopsOn(t, img)
	cmd := exec.Command("bash", append([]string{filepath.Join(e.repo, "scripts/flash-pi.sh"), img}, args...)...)
	cmd.Env = append(os.Environ(), "OUTPOST="+e.outpost, "TMPDIR="+e.tmpdir)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if after := loopsOn(t, img); after != before {
		t.Errorf("loop devices on %s: %q after flash-pi.sh, %q before", img, after, before)
		reclaim(t, after, before)
	}
	if left, _ := os.ReadDir(e.tmpdir); len(left) > 0 {
		t.Errorf("flash-pi.sh left %v in its TMPDIR", left)
		for _, l := range left {
			os.RemoveAll(filepath.Join(e.tmpdir, l.Name()))
		}
	}
	return string(out), code
}

func (e *flashEnv) args(extra ...string) []string {
	return append([]string{"--deb", e.deb, "--config", e.config}, extra...)
}

// reclaim unmounts and detaches the loop devices in after but not in
// before, which a failed flash-pi.sh left behind, so that they do not
// outlive the test.
func reclaim(t *testing.T, after, before string) {
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	for _, dev := range strings.Fields(after) {
		if slices.Contains(strings.Fields(before), dev) {
			continue
		}
		// mountinfo: id parent major:minor root mountpoint ... - fstype source ...
		for _, line := range strings.Split(string(mountinfo), "\n") {
			f := strings.Fields(line)
			if i := slices.Index(f, "-"); i > 4 && i+2 < len(f) && strings.HasPrefix(f[i+2], dev+"p") {
				if out, err := exec.Command("umount", f[4]).CombinedOutput(); err != nil {
					t.Errorf("umount %s: %v: %s", f[4], err, out)
				}
			}
		}
		exec.Command("losetup", "-d", dev).Run()
	}
}

// loopsOn returns the loop devices attached to img, as losetup -j lists
// them.
func loopsOn(t *testing.T, img string) string {
	t.Helper()
	out, err := exec.Command("losetup", "-n", "-O", "NAME", "-j", img).CombinedOutput()
	if err != nil {
		t.Errorf("losetup -j %s: %v: %s", img, err, out)
	}
	return strings.TrimSpace(string(out))
}

func testFlashInstall(t *testing.T, e *flashEnv) {
	img := buildImage(t, piImage{parts: 2, bootFS: "vfat", cmdline: piCmdline + "\n", merged: true,
		machine: elf.EM_AARCH64, piUser: true, hosts: piHosts, units: true,
		dpkg: "Package: bash\nStatus: install ok installed\nVersion: 5.2.15-2\n"})
	preRoot, preBoot := snapshot(t, img)

	args := e.args("--manifests", e.mfests, "--images", e.images, "--hostname", "node-1", "--ssh-key", e.key)
	out, code := e.flash(t, img, nil, args...)
	if code != 0 {
		t.Fatalf("flash-pi.sh exited %d:\n%s", code, out)
	}
	t.Logf("flash-pi.sh:\n%s", out)
	if !strings.Contains(out, "no containerd and runc") {
		t.Errorf("no warning that the image lacks containerd:\n%s", out)
	}
	root, boot := snapshot(t, img)

	// Files flash-pi.sh writes: path, mode, uid:gid, content.
	deb, _ := os.ReadFile(e.deb)
	cfg, _ := os.ReadFile(e.config)
	web, _ := os.ReadFile(filepath.Join(e.mfests, "web.yaml"))
	tarball, _ := os.ReadFile(filepath.Join(e.images, "app.tar"))
	hosts := strings.Replace(piHosts, "127.0.1.1\t\traspberrypi", "127.0.1.1\tnode-1", 1)
	want := map[string]fsEntry{
		"/etc/outpost/config.yaml":                      regEntry(0o644, 0, cfg),
		"/etc/outpost/manifests":                        dirEntry(0o755, 0),
		"/etc/outpost/manifests/web.yaml":               regEntry(0o600, 0, web),
		"/var/lib/outpost":                              dirEntry(0o700, 0),
		"/var/lib/outpost/images":                       dirEntry(0o700, 0),
		"/var/lib/outpost/images/app.tar":               regEntry(0o600, 0, tarball),
		"/var/cache/outpost/outpost.deb":                regEntry(0o644, 0, deb),
		"/etc/hostname":                                 regEntry(0o644, 0, []byte("node-1\n")),
		"/etc/hosts":                                    regEntry(0o644, 0, []byte(hosts)),
		"/home/pi/.ssh":                                 dirEntry(0o700, 1000),
		"/home/pi/.ssh/authorized_keys":                 regEntry(0o600, 1000, []byte(testKey+"\n")),
		"/etc/systemd/system/outpost-firstboot.service": {},
		// systemctl enable's link, to the path the package installs.
		"/etc/systemd/system/multi-user.target.wants/outpost.service":           linkEntry("/lib/systemd/system/outpost.service"),
		"/etc/systemd/system/multi-user.target.wants/outpost-firstboot.service": linkEntry("/etc/systemd/system/outpost-firstboot.service"),
	}
	// The package's files, through the image's /lib -> usr/lib.
	payload := payloadFiles(t, e.payload)
	for p, ent := range payload {
		if p == "/etc/outpost/config.yaml" {
			continue
		}
		if _, ok := want[p]; !ok {
			want[mergedPath(p)] = ent
		}
	}
	for p, w := range want {
		got, ok := root[p]
		switch {
		case !ok:
			t.Errorf("%s: missing from the image", p)
		case p == "/etc/systemd/system/outpost-firstboot.service":
			if got.mode != 0o644 || got.uid != 0 || got.sum == "" {
				t.Errorf("%s: %v", p, got)
			}
		case got != w:
			t.Errorf("%s: %v, want %v", p, got, w)
		}
	}
	if root["/lib"] != linkEntry("usr/lib") || root["/bin"] != linkEntry("usr/bin") {
		t.Errorf("/lib %v, /bin %v: the image's links into /usr were replaced", root["/lib"], root["/bin"])
	}
	for _, p := range []string{"/etc/outpost/manifests/notes.txt", "/var/lib/outpost/images/README"} {
		if _, ok := root[p]; ok {
			t.Errorf("%s copied: the agent reads only *.yaml, *.yml and *.tar", p)
		}
	}
	checkFirstboot(t, img)

	// Nothing else changed, and nothing new outside what it writes.
	for p, pre := range preRoot {
		if _, ok := want[p]; !ok && root[p] != pre {
			t.Errorf("%s changed: %v, was %v", p, root[p], pre)
		}
	}
	allowed := map[string]bool{}
	for p := range want {
		for ; p != "/"; p = filepath.Dir(p) {
			allowed[p] = true
		}
	}
	for p := range root {
		if _, pre := preRoot[p]; !pre && !allowed[p] {
			t.Errorf("%s: written, but flash-pi.sh should not write it", p)
		}
	}

	wantBoot := map[string]string{
		"cmdline.txt": piCmdline + " cgroup_enable=memory cgroup_memory=1\n",
		"config.txt":  preBoot["config.txt"],
		"ssh":         "",
	}
	if !sameMap(boot, wantBoot) {
		t.Errorf("boot partition:\n%q\nwant\n%q", boot, wantBoot)
	}

	// Again: the same image, and it says so.
	out, code = e.flash(t, img, nil, args...)
	if code != 0 {
		t.Fatalf("second run exited %d:\n%s", code, out)
	}
	if !strings.Contains(out, "nothing changed") {
		t.Errorf("second run did not say nothing changed:\n%s", out)
	}
	root2, boot2 := snapshot(t, img)
	if !sameMap(root2, root) {
		for p := range root2 {
			if root2[p] != root[p] {
				t.Errorf("second run changed %s: %v, was %v", p, root2[p], root[p])
			}
		}
		for p := range root {
			if _, ok := root2[p]; !ok {
				t.Errorf("second run removed %s", p)
			}
		}
	}
	if !sameMap(boot2, boot) {
		t.Errorf("second run changed the boot partition:\n%q\nwas\n%q", boot2, boot)
	}
	fsckImage(t, img)
}

// checkFirstboot checks the first-boot unit that registers the package.
func checkFirstboot(t *testing.T, img string) {
	t.Helper()
	unit := readInImage(t, img, "/etc/systemd/system/outpost-firstboot.service")
	for _, l := range []string{
		"ConditionPathExists=/var/cache/outpost/outpost.deb",
		"After=outpost.service local-fs.target",
		"Type=oneshot",
		"ExecStart=/usr/bin/dpkg --install --force-confdef --force-confold /var/cache/outpost/outpost.deb",
		"WantedBy=multi-user.target",
	} {
		if !slices.Contains(strings.Split(unit, "\n"), l) {
			t.Errorf("outpost-firstboot.service lacks %q:\n%s", l, unit)
		}
	}
	if strings.Contains(unit, "Before=outpost.service") {
		t.Error("outpost-firstboot.service is ordered before outpost.service: the postinst's systemctl start would deadlock")
	}
}

// testFlashVariant: a root without merged /usr, no uid 1000 user,
// containerd installed, a cmdline.txt with one of the two parameters,
// and a config that moves manifestDir and imageDir.
func testFlashVariant(t *testing.T, e *flashEnv) {
	img := buildImage(t, piImage{parts: 2, bootFS: "vfat", cmdline: "console=tty1 root=PARTUUID=6c1e2a3b-02 cgroup_memory=1 rootwait  ",
		machine: elf.EM_AARCH64, hosts: "127.0.0.1\tlocalhost\n", rootKeys: otherKey,
		dpkg: "Package: containerd\nStatus: install ok installed\n\nPackage: runc\nStatus: install ok installed\n"})
	cfg := putFile(t, t.TempDir(), "config.yaml", "manifestDir: /srv/outpost/manifests\nimageDir: \"/srv/outpost/images\" # moved\n")
	out, code := e.flash(t, img, nil, "--deb", e.deb, "--config", cfg, "--manifests", e.mfests,
		"--images", e.images, "--hostname", "edge-7", "--ssh-key", e.key)
	if code != 0 {
		t.Fatalf("flash-pi.sh exited %d:\n%s", code, out)
	}
	if strings.Contains(out, "has no containerd") {
		t.Errorf("warned about containerd, which the image has:\n%s", out)
	}
	root, boot := snapshot(t, img)
	for p, w := range map[string]fsEntry{
		"/lib/systemd/system/outpost.service": {mode: 0o644},
		"/srv/outpost/manifests/web.yaml":     {mode: 0o600},
		"/srv/outpost/images":                 dirEntry(0o700, 0),
		"/srv/outpost/images/app.tar":         {mode: 0o600},
		"/root/.ssh":                          dirEntry(0o700, 0),
		"/root/.ssh/authorized_keys":          regEntry(0o600, 0, []byte(otherKey+"\n"+testKey+"\n")),
		"/etc/hosts":                          regEntry(0o644, 0, []byte("127.0.0.1\tlocalhost\n127.0.1.1\tedge-7\n")),
	} {
		got := root[p]
		if w.sum == "" {
			got.sum = ""
		}
		if got != w {
			t.Errorf("%s: %v, want %v", p, got, w)
		}
	}
	for _, p := range []string{"/etc/outpost/manifests/web.yaml", "/var/lib/outpost/images"} {
		if _, ok := root[p]; ok {
			t.Errorf("%s written, but the config moves it", p)
		}
	}
	if want := "console=tty1 root=PARTUUID=6c1e2a3b-02 cgroup_memory=1 rootwait cgroup_enable=memory\n"; boot["cmdline.txt"] != want {
		t.Errorf("cmdline.txt %q, want %q", boot["cmdline.txt"], want)
	}
}

func testFlashRefusals(t *testing.T, e *flashEnv) {
	good := piImage{parts: 2, bootFS: "vfat", cmdline: piCmdline + "\n", merged: true,
		machine: elf.EM_AARCH64, piUser: true, hosts: piHosts, units: true}
	random := func(t *testing.T) string {
		b := make([]byte, 4<<20)
		rand.Read(b)
		return putFile(t, t.TempDir(), "random.img", string(b))
	}
	// One image serves the cases refused for their arguments: being
	// refused, it stays as it was, which each case checks.
	goodImg := buildImage(t, good)
	same := func(*testing.T) string { return goodImg }
	spec := func(f func(*piImage)) func(*testing.T) string {
		return func(t *testing.T) string {
			s := good
			f(&s)
			return buildImage(t, s)
		}
	}
	// Packages like the real one but for another architecture.
	repack := func(arch string) string {
		dir := t.TempDir()
		run(t, ".", "dpkg-deb", "-R", e.deb, filepath.Join(dir, "pkg"))
		ctl := filepath.Join(dir, "pkg/DEBIAN/control")
		b, _ := os.ReadFile(ctl)
		b = bytes.Replace(b, []byte("Architecture: arm64"), []byte("Architecture: "+arch), 1)
		if err := os.WriteFile(ctl, b, 0o644); err != nil {
			t.Fatal(err)
		}
		deb := filepath.Join(dir, "outpost_"+arch+".deb")
		run(t, ".", "dpkg-deb", "-Znone", "--root-owner-group", "-b", filepath.Join(dir, "pkg"), deb)
		return deb
	}
	armhf, amd64 := repack("armhf"), repack("amd64")
	badConfig := putFile(t, t.TempDir(), "bad.yaml", "nodeName: x\nbogus: 1\n")

	for _, tc := range []struct {
		name  string
		image func(*testing.T) string
		args  []string
		code  int
		want  []string // in the output
	}{
		{"RandomFile", random, e.args(), 1, []string{"random.img: no partition table"}},
		{"Compressed", func(t *testing.T) string {
			return putFile(t, t.TempDir(), "pi.img.xz", "\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4\x46")
		}, e.args(), 1, []string{"pi.img.xz: xz-compressed"}},
		{"OnePartition", spec(func(s *piImage) { s.parts = 1 }), e.args(), 1, []string{"no partition 2"}},
		{"BootNotFAT", spec(func(s *piImage) { s.bootFS = "ext4" }), e.args(), 1, []string{"partition 1 is ext4, not FAT"}},
		{"NoCmdline", spec(func(s *piImage) { s.cmdline = "" }), e.args(), 1, []string{"partition 1 has no cmdline.txt"}},
		{"TwoLineCmdline", spec(func(s *piImage) { s.cmdline = "a=1\nb=2\n" }), e.args(), 1, []string{"cmdline.txt has 2 lines"}},
		{"NoOSRelease", spec(func(s *piImage) { s.osID = "-" }), e.args(), 1, []string{"no /etc/os-release"}},
		{"NotDebian", spec(func(s *piImage) { s.osID = "fedora" }), e.args(), 1, []string{"ID=fedora", "not Debian-based"}},
		{"X86Root", spec(func(s *piImage) { s.machine = elf.EM_X86_64 }), e.args(), 1, []string{"/usr/bin/ls is an x86-64 binary"}},
		{"ArmhfDebArm64Image", same, []string{"--deb", armhf, "--config", e.config}, 1,
			[]string{"is for armhf", "userland is arm64", "64-bit ARM"}},
		{"Amd64Deb", same, []string{"--deb", amd64, "--config", e.config}, 1, []string{"architecture amd64"}},
		{"BadConfig", same, []string{"--deb", e.deb, "--config", badConfig}, 1,
			[]string{"bad.yaml: rejected by", "bogus: unknown field"}},
		{"PrivateKey", same, e.args("--ssh-key", putFile(t, t.TempDir(), "id_ed25519",
			"-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")), 1, []string{"a private key"}},
		{"NoSpace", spec(func(s *piImage) { s.rootMiB = 16 }), e.args(), 1, []string{"free and needs", "grow the image first"}},
		{"NoDeb", same, []string{"--config", e.config}, 2, []string{"--deb is required"}},
		{"BadHostname", same, e.args("--hostname", "Pi_1"), 2, []string{"--hostname Pi_1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := tc.image(t)
			before := sumFile(t, img)
			out, code := e.flash(t, img, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if sumFile(t, img) != before {
				t.Error("the image changed, but it was refused")
			}
		})
	}

	// A block device is refused without --force; the test's own loop
	// device stands in for an SD card, and stays attached.
	t.Run("BlockDevice", func(t *testing.T) {
		img := buildImage(t, good)
		dev := attachLoop(t, img, false)
		out, code := e.flash(t, dev.name, nil, e.args()...)
		if code != 1 || !strings.Contains(out, "is a block device") || !strings.Contains(out, "--force") {
			t.Errorf("exit %d, want 1 and a word about --force:\n%s", code, out)
		}
		if got, _ := exec.Command("losetup", "-n", "-O", "BACK-FILE", dev.name).Output(); strings.TrimSpace(string(got)) != img {
			t.Errorf("%s no longer attached to %s: %q", dev.name, img, got)
		}
		// An image that is attached already is not touched.
		out, code = e.flash(t, img, nil, e.args()...)
		if code != 1 || !strings.Contains(out, "attached to "+dev.name) {
			t.Errorf("exit %d on an attached image, want 1 naming %s:\n%s", code, dev.name, out)
		}
		// With --force, the device is flashed in place.
		out, code = e.flash(t, dev.name, nil, e.args("--force")...)
		if code != 0 {
			t.Fatalf("--force on %s: exit %d:\n%s", dev.name, code, out)
		}
		dev.detach(t)
		root, boot := snapshot(t, img)
		if root["/usr/bin/outpost"].sum == "" || !strings.Contains(boot["cmdline.txt"], "cgroup_memory=1") {
			t.Errorf("--force did not flash %s: /usr/bin/outpost %v, cmdline.txt %q", dev.name, root["/usr/bin/outpost"], boot["cmdline.txt"])
		}
	})
}

// testFlashSignal: a TERM while the root is mounted read-write still
// unmounts and detaches everything, leaves a clean file system, and a
// second run finishes the job.
func testFlashSignal(t *testing.T, e *flashEnv) {
	img := buildImage(t, piImage{parts: 2, bootFS: "vfat", cmdline: piCmdline + "\n", merged: true,
		machine: elf.EM_AARCH64, piUser: true, hosts: piHosts, units: true})
	mcopy, err := exec.LookPath("mcopy")
	if err != nil {
		t.Fatal(err)
	}
	// mcopy is the script's last step: this one signals the script first.
	bin := t.TempDir()
	putFile(t, bin, "mcopy", "#!/bin/sh\nkill -TERM $PPID\nexec "+mcopy+" \"$@\"\n")
	if err := os.Chmod(filepath.Join(bin, "mcopy"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, code := e.flash(t, img, []string{"PATH=" + bin + ":" + os.Getenv("PATH")}, e.args("--ssh-key", e.key)...)
	if code != 143 {
		t.Fatalf("exit %d after SIGTERM, want 143:\n%s", code, out)
	}
	fsckImage(t, img)
	out, code = e.flash(t, img, nil, e.args("--ssh-key", e.key)...)
	if code != 0 {
		t.Fatalf("run after the interrupted one exited %d:\n%s", code, out)
	}
	_, boot := snapshot(t, img)
	if !strings.Contains(boot["cmdline.txt"], "cgroup_memory=1") {
		t.Errorf("cmdline.txt %q after the second run", boot["cmdline.txt"])
	}
}

// fsEntry is what a snapshot records of a file.
type fsEntry struct {
	mode     fs.FileMode // type and permission bits
	uid, gid uint32
	link     string // a symlink's target
	sum      string // a regular file's sha256
}

func (e fsEntry) String() string {
	return fmt.Sprintf("{%v %d:%d %q %.12s}", e.mode, e.uid, e.gid, e.link, e.sum)
}

func regEntry(perm fs.FileMode, owner uint32, content []byte) fsEntry {
	s := sha256.Sum256(content)
	return fsEntry{mode: perm, uid: owner, gid: owner, sum: hex.EncodeToString(s[:])}
}

func dirEntry(perm fs.FileMode, owner uint32) fsEntry {
	return fsEntry{mode: fs.ModeDir | perm, uid: owner, gid: owner}
}

func linkEntry(target string) fsEntry { return fsEntry{mode: fs.ModeSymlink | 0o777, link: target} }

func sameMap[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// mergedPath is where p of a package lands in a merged-/usr root.
func mergedPath(p string) string {
	for _, d := range []string{"/lib", "/bin", "/sbin"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "/usr" + p
		}
	}
	return p
}

// payloadFiles lists the regular files of an unpacked package as the
// image should hold them (owned by root).
func payloadFiles(t *testing.T, root string) map[string]fsEntry {
	files := map[string]fsEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[strings.TrimPrefix(p, root)] = regEntry(info.Mode().Perm(), 0, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("the package holds only %v", files)
	}
	return files
}

// putFile writes content to dir/name and returns the path.
func putFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// sumFile returns the sha256 of the file p.
func sumFile(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// loopDev is a loop device the test attached.
type loopDev struct {
	name, img string
	detached  bool
}

// attachLoop attaches img, with partition devices, until the test ends.
func attachLoop(t *testing.T, img string, readOnly bool) *loopDev {
	t.Helper()
	args := []string{"--find", "--show", "--partscan"}
	if readOnly {
		args = append(args, "--read-only")
	}
	d := &loopDev{name: strings.TrimSpace(run(t, ".", "losetup", append(args, img)...)), img: img}
	t.Cleanup(func() { d.detach(t) })
	// Some kernels do not scan loop devices: partx adds the partitions.
	if _, err := os.Stat(d.part(1)); err != nil {
		exec.Command("partx", "--add", d.name).Run()
	}
	waittest.Poll{Timeout: 5 * time.Second, Every: 100 * time.Millisecond}.For(t, "partition device "+d.part(1), func() (bool, string) {
		_, err := os.Stat(d.part(1))
		return err == nil, fmt.Sprint(err)
	})
	return d
}

func (d *loopDev) part(n int) string { return fmt.Sprintf("%sp%d", d.name, n) }

// detach detaches the device if it is still the one attached to the
// image: once detached, its number may be someone else's.
func (d *loopDev) detach(t *testing.T) {
	if d.detached {
		return
	}
	d.detached = true
	out, _ := exec.Command("losetup", "-n", "-O", "BACK-FILE", d.name).Output()
	if strings.TrimSpace(string(out)) != d.img {
		return
	}
	if out, err := exec.Command("losetup", "-d", d.name).CombinedOutput(); err != nil {
		t.Errorf("losetup -d %s: %v: %s", d.name, err, out)
		return
	}
	// A device still open (its partitions just unmounted) is only
	// marked to go when the last user closes it: wait until it has, so
	// the next flash-pi.sh run does not find it listed before it starts
	// and gone after (CI saw "/dev/loop0" before, "" after).
	waittest.Poll{Timeout: 10 * time.Second, Every: 50 * time.Millisecond}.For(t, d.name+" detached from "+d.img, func() (bool, string) {
		out, _ := exec.Command("losetup", "-n", "-O", "BACK-FILE", d.name).Output()
		back := strings.TrimSpace(string(out))
		return back != d.img, back
	})
}

// mountRoot mounts the image's root file system on a temporary
// directory until the test ends, or until the returned func is called.
func mountRoot(t *testing.T, dev *loopDev, opts string) (string, func()) {
	t.Helper()
	mnt := t.TempDir()
	run(t, ".", "mount", "-t", "ext4", "-o", opts, dev.part(2), mnt)
	umount := func() {
		if exec.Command("mountpoint", "-q", mnt).Run() == nil {
			run(t, ".", "umount", mnt)
		}
	}
	t.Cleanup(umount)
	return mnt, umount
}

// runMtools runs an mtools command and returns its standard output.
func runMtools(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// buildImage writes a synthetic Raspberry Pi OS image as s describes.
func buildImage(t *testing.T, s piImage) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "pi.img")
	run(t, ".", "truncate", "-s", "120M", img)
	// As Pi OS lays them out: boot at 4 MiB, the root right after it.
	table := "label: dos\nlabel-id: 0x6c1e2a3b\nstart=8192, size=48MiB, type=c\n"
	if s.parts == 2 {
		table += "start=106496, type=83"
		if s.rootMiB > 0 {
			table += fmt.Sprintf(", size=%dMiB", s.rootMiB)
		}
		table += "\n"
	}
	cmd := exec.Command("sfdisk", "--quiet", img)
	cmd.Stdin = strings.NewReader(table)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v: %s", err, out)
	}
	dev := attachLoop(t, img, false)
	if s.bootFS == "vfat" {
		run(t, ".", "mkfs.vfat", "-F", "32", "-n", "BOOTFS", dev.part(1))
		dir := t.TempDir()
		runMtools(t, "mcopy", "-i", dev.part(1), putFile(t, dir, "config.txt", piConfigTxt), "::/config.txt")
		if s.cmdline != "" {
			runMtools(t, "mcopy", "-i", dev.part(1), putFile(t, dir, "cmdline.txt", s.cmdline), "::/cmdline.txt")
		}
	} else {
		run(t, ".", "mkfs.ext4", "-q", dev.part(1))
	}
	if s.parts == 2 {
		run(t, ".", "mkfs.ext4", "-q", "-L", "rootfs", dev.part(2))
		root, umount := mountRoot(t, dev, "rw")
		populateRoot(t, root, s)
		umount()
	}
	dev.detach(t)
	return img
}

// populateRoot writes the few files of Raspberry Pi OS that flash-pi.sh
// reads or changes.
func populateRoot(t *testing.T, root string, s piImage) {
	t.Helper()
	mkdir := func(p string, perm fs.FileMode, owner int) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, p), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(root, p), owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	symlink := func(target, p string) {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "usr/bin", "usr/sbin", "usr/lib", "var/lib/dpkg", "var/cache", "home"} {
		mkdir(d, 0o755, 0)
	}
	mkdir("root", 0o700, 0)
	ls := "usr/bin/ls"
	if s.merged {
		symlink("usr/bin", "bin")
		symlink("usr/sbin", "sbin")
		symlink("usr/lib", "lib")
	} else {
		for _, d := range []string{"bin", "sbin", "lib"} {
			mkdir(d, 0o755, 0)
		}
		ls = "bin/ls"
	}
	if err := os.WriteFile(filepath.Join(root, ls), elfHeader(t, s.machine), 0o755); err != nil {
		t.Fatal(err)
	}
	// As on Debian: /etc/os-release is a relative link into /usr/lib.
	switch s.osID {
	case "":
		putFile(t, filepath.Join(root, "usr/lib"), "os-release", piOSRelease)
		symlink("../usr/lib/os-release", "etc/os-release")
	case "-":
	default:
		putFile(t, filepath.Join(root, "etc"), "os-release", "NAME=Other\nID="+s.osID+"\n")
	}
	passwd := piPasswd
	if !s.piUser {
		passwd = strings.ReplaceAll(passwd, "pi:x:1000:1000:,,,:/home/pi:/bin/bash\n", "")
	} else {
		mkdir("home/pi", 0o700, 1000)
	}
	putFile(t, filepath.Join(root, "etc"), "passwd", passwd)
	putFile(t, filepath.Join(root, "etc"), "hostname", "raspberrypi\n")
	putFile(t, filepath.Join(root, "etc"), "hosts", s.hosts)
	putFile(t, filepath.Join(root, "var/lib/dpkg"), "status", s.dpkg)
	if s.units {
		mkdir("etc/systemd/system/multi-user.target.wants", 0o755, 0)
	}
	if s.rootKeys != "" {
		mkdir("root/.ssh", 0o700, 0)
		p := putFile(t, filepath.Join(root, "root/.ssh"), "authorized_keys", s.rootKeys)
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// elfHeader returns the ELF header of an executable for machine (an
// ARM one 32-bit when machine is EM_ARM).
func elfHeader(t *testing.T, machine elf.Machine) []byte {
	t.Helper()
	var b bytes.Buffer
	ident := [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)}
	var err error
	if machine == elf.EM_ARM {
		ident[elf.EI_CLASS] = byte(elf.ELFCLASS32)
		err = binary.Write(&b, binary.LittleEndian, elf.Header32{Ident: ident, Type: uint16(elf.ET_EXEC),
			Machine: uint16(machine), Version: uint32(elf.EV_CURRENT), Ehsize: 52})
	} else {
		err = binary.Write(&b, binary.LittleEndian, elf.Header64{Ident: ident, Type: uint16(elf.ET_EXEC),
			Machine: uint16(machine), Version: uint32(elf.EV_CURRENT), Ehsize: 64})
	}
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(b.Bytes()))
	if err != nil || f.Machine != machine {
		t.Fatalf("synthetic ELF header: %v, machine %v", err, f)
	}
	return b.Bytes()
}

// snapshot returns every file of the image's root, and the contents of
// the files of its boot partition, read through a read-only loop device
// of the test's own.
func snapshot(t *testing.T, img string) (map[string]fsEntry, map[string]string) {
	t.Helper()
	dev := attachLoop(t, img, true)
	defer dev.detach(t)
	boot := map[string]string{}
	for _, name := range strings.Fields(runMtools(t, "mdir", "-b", "-i", dev.part(1), "::/")) {
		name = strings.TrimPrefix(name, "::/")
		boot[name] = runMtools(t, "mtype", "-i", dev.part(1), "::/"+name)
	}
	mnt, umount := mountRoot(t, dev, "ro")
	defer umount()
	root := map[string]fsEntry{}
	err := filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, mnt)
		if rel == "" || rel == "/lost+found" {
			if rel != "" {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		e := fsEntry{mode: info.Mode() & (fs.ModeType | fs.ModePerm), uid: st.Uid, gid: st.Gid}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			e.link, err = os.Readlink(p)
		case info.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			s := sha256.Sum256(b)
			e.sum = hex.EncodeToString(s[:])
		}
		root[rel] = e
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return root, boot
}

// readInImage returns one file of the image's root.
func readInImage(t *testing.T, img, path string) string {
	t.Helper()
	dev := attachLoop(t, img, true)
	defer dev.detach(t)
	mnt, umount := mountRoot(t, dev, "ro")
	defer umount()
	b, err := os.ReadFile(filepath.Join(mnt, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fsckImage checks both file systems of the image.
func fsckImage(t *testing.T, img string) {
	t.Helper()
	dev := attachLoop(t, img, true)
	defer dev.detach(t)
	if out, err := exec.Command("e2fsck", "-fn", dev.part(2)).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn: %v\n%s", err, out)
	}
	if fsckVfat, err := exec.LookPath("fsck.vfat"); err == nil {
		if out, err := exec.Command(fsckVfat, "-n", dev.part(1)).CombinedOutput(); err != nil {
			t.Errorf("fsck.vfat -n: %v\n%s", err, out)
		}
	}
}
