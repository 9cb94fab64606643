package env

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestImage is the reference of the test image: busybox-static with the
// applets the tests use, for amd64 and arm64.
const TestImage = "outpost.test/busybox:1.35"

// applets are linked to busybox in the image's /bin.
var applets = []string{
	"sh", "sleep", "httpd", "wget", "nc", "cat", "echo", "ls", "env", "printenv", "id", "hostname",
	"ps", "kill", "mkdir", "rm", "touch", "true", "false", "test", "grep", "head", "tail", "date",
	"ip", "ifconfig", "nslookup", "tee", "wc", "dd", "df", "mount", "stat", "seq",
}

// epoch is the modification time of every file in the image, so the same
// busybox binaries always give the same digests.
var epoch = time.Unix(0, 0).UTC()

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// layout collects the blobs of an OCI image layout.
type layout struct {
	blobs map[string][]byte
	// manifests are the image manifests, one per platform, and index
	// the image index over them.
	manifests []descriptor
	index     descriptor
}

func (l *layout) add(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	d := "sha256:" + hex.EncodeToString(sum[:])
	l.blobs[d] = data
	return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

// WriteTestImage writes the test image as an OCI image layout tarball, as
// `ctr images import` and containerd's Import read it. busybox maps a
// GOARCH (amd64, arm64) to a static busybox binary for it.
func WriteTestImage(w io.Writer, busybox map[string]string) error {
	return WriteTestImageAs(w, busybox, TestImage)
}

// WriteTestImageAs writes the test image as WriteTestImage does, named
// name (a full reference with a tag, such as outpost.test/other:1) instead
// of TestImage.
func WriteTestImageAs(w io.Writer, busybox map[string]string, name string) error {
	return writeImage(w, busybox, name, ImageConfig{Cmd: []string{"sh"}})
}

// ImageConfig is what a test image's config says beyond the test
// image's.
type ImageConfig struct {
	Cmd []string
	// StopSignal is the image's STOPSIGNAL, "" for none.
	StopSignal string
}

// writeImage writes the test image named name with config cfg.
func writeImage(w io.Writer, busybox map[string]string, name string, cfg ImageConfig) error {
	l, err := buildTestImage(busybox, cfg)
	if err != nil {
		return err
	}
	top := l.index
	tag := name[strings.LastIndex(name, ":")+1:]
	top.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": tag,
	}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []descriptor{top},
	})

	tw := tar.NewWriter(w)
	put := func(path string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	digests := make([]string, 0, len(l.blobs))
	for d := range l.blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := put(filepath.Join("blobs", "sha256", d[len("sha256:"):]), l.blobs[d]); err != nil {
			return err
		}
	}
	return tw.Close()
}

// buildTestImage makes the blobs of the test image: per architecture a
// layer, a config and a manifest, and an index over the manifests.
func buildTestImage(busybox map[string]string, ic ImageConfig) (*layout, error) {
	l := &layout{blobs: map[string][]byte{}}
	arches := make([]string, 0, len(busybox))
	for a := range busybox {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	var manifests []descriptor
	for _, arch := range arches {
		bin, err := os.ReadFile(busybox[arch])
		if err != nil {
			return nil, fmt.Errorf("test image %s: %w", arch, err)
		}
		layerTar, err := rootfs(bin)
		if err != nil {
			return nil, err
		}
		diffID := sha256.Sum256(layerTar)
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		zw.ModTime = epoch
		zw.Write(layerTar)
		zw.Close()
		layer := l.add("application/vnd.oci.image.layer.v1.tar+gzip", gz.Bytes())
		imageConfig := map[string]any{"Env": []string{"PATH=/bin"}, "Cmd": ic.Cmd, "WorkingDir": "/"}
		if ic.StopSignal != "" {
			imageConfig["StopSignal"] = ic.StopSignal
		}
		cfg, _ := json.Marshal(map[string]any{
			"architecture": arch, "os": "linux", "created": epoch.Format(time.RFC3339),
			"config": imageConfig,
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}},
		})
		config := l.add("application/vnd.oci.image.config.v1+json", cfg)
		man, _ := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
			"config": config, "layers": []descriptor{layer},
		})
		d := l.add("application/vnd.oci.image.manifest.v1+json", man)
		d.Platform = &platform{Architecture: arch, OS: "linux"}
		manifests = append(manifests, d)
	}
	idx, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests,
	})
	l.manifests = manifests
	l.index = l.add("application/vnd.oci.image.index.v1+json", idx)
	return l, nil
}

// rootfs builds the image's one layer: busybox, its applet links, and the
// few files a container expects.
func rootfs(busybox []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: name + "/", Mode: mode, ModTime: epoch, Typeflag: tar.TypeDir})
	}
	file := func(name string, mode int64, data []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg})
		tw.Write(data)
	}
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "var", "var/www", "root"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	file("bin/busybox", 0o755, busybox)
	for _, a := range applets {
		tw.WriteHeader(&tar.Header{Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch, Typeflag: tar.TypeSymlink})
	}
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"))
	// root is a member of wheel, so a container's additional groups
	// come from the image (TestE2EImageGroupsInEveryContainer).
	file("etc/group", 0o644, []byte("root:x:0:\nwheel:x:10:root\nnogroup:x:65534:\n"))
	file("var/www/index.html", 0o644, []byte("hello from outpost\n"))
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTestRootfs unpacks the test image's root filesystem for this
// machine into dir: what a bare runc bundle runs.
func WriteTestRootfs(t testing.TB, dir string) {
	t.Helper()
	bin, ok := busyboxBinaries(t)[runtime.GOARCH]
	if !ok {
		t.Fatalf("no busybox for %s", runtime.GOARCH)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := rootfs(data)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm|modeSticky(h.Mode))
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		}
		if err != nil {
			t.Fatalf("unpack the test rootfs: %v", err)
		}
	}
}

// modeSticky is the sticky bit of a tar mode, as an os.FileMode.
func modeSticky(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}
