package imageio

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// testImage is a small multi-platform image: per architecture a layer
// of one file, a config and a manifest, and an index over the manifests.
type testImage struct {
	blobs map[digest.Digest][]byte
	index ocispec.Descriptor
	// By architecture:
	manifests map[string]ocispec.Descriptor
	configs   map[string]ocispec.Descriptor
	layers    map[string]ocispec.Descriptor // gzip
	layerTars map[string][]byte             // uncompressed
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	p, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (im *testImage) add(mediaType string, p []byte) ocispec.Descriptor {
	d := digest.FromBytes(p)
	im.blobs[d] = p
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(p))}
}

// newTestImage builds the test image for the architectures (linux).
func newTestImage(t testing.TB, arches ...string) *testImage {
	t.Helper()
	im := &testImage{
		blobs:     map[digest.Digest][]byte{},
		manifests: map[string]ocispec.Descriptor{}, configs: map[string]ocispec.Descriptor{},
		layers: map[string]ocispec.Descriptor{}, layerTars: map[string][]byte{},
	}
	var manifests []ocispec.Descriptor
	for _, arch := range arches {
		layerTar := tarball(t, tarEntry{name: "hello", data: []byte("hello from " + arch + "\n")})
		im.layerTars[arch] = layerTar
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(layerTar)
		zw.Close()
		im.layers[arch] = im.add(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
		im.configs[arch] = im.add(ocispec.MediaTypeImageConfig, mustJSON(t, ocispec.Image{
			Platform: ocispec.Platform{Architecture: arch, OS: "linux"},
			Config:   ocispec.ImageConfig{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}},
			RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar)}},
		}))
		m := im.add(ocispec.MediaTypeImageManifest, mustJSON(t, ocispec.Manifest{
			Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageManifest,
			Config: im.configs[arch], Layers: []ocispec.Descriptor{im.layers[arch]},
		}))
		m.Platform = &ocispec.Platform{Architecture: arch, OS: "linux"}
		im.manifests[arch] = m
		manifests = append(manifests, m)
	}
	im.index = im.add(ocispec.MediaTypeImageIndex, mustJSON(t, ocispec.Index{
		Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: manifests,
	}))
	return im
}

// ociLayout returns the image as an OCI layout tarball whose index.json
// names the index with annotations (nil: none).
func (im *testImage) ociLayout(t testing.TB, annotations map[string]string) []byte {
	t.Helper()
	top := im.index
	top.Annotations = annotations
	entries := []tarEntry{
		{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: "index.json", data: mustJSON(t, ocispec.Index{Versioned: specsVersioned(), MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{top}})},
	}
	for _, d := range slices.Sorted(maps.Keys(im.blobs)) {
		entries = append(entries, tarEntry{name: path.Join("blobs", d.Algorithm().String(), d.Encoded()), data: im.blobs[d]})
	}
	return tarball(t, entries...)
}

// dockerArchive returns the arch image as `docker save` writes it (v1.2:
// uncompressed layers, as <id>/layer.tar), tagged tags.
func (im *testImage) dockerArchive(t testing.TB, arch string, tags ...string) []byte {
	t.Helper()
	config := im.configs[arch].Digest.Encoded() + ".json"
	layer := digest.FromBytes(im.layerTars[arch]).Encoded() + "/layer.tar"
	return tarball(t,
		tarEntry{name: config, data: im.blobs[im.configs[arch].Digest]},
		tarEntry{name: layer, data: im.layerTars[arch]},
		tarEntry{name: "manifest.json", data: mustJSON(t, []dockerManifest{{Config: config, RepoTags: tags, Layers: []string{layer}}})},
	)
}

// tarEntry is a file of a tarball: a regular file, or a symlink to link.
type tarEntry struct {
	name string
	data []byte
	link string
}

func tarball(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
		if e.link != "" {
			h = &tar.Header{Name: e.name, Mode: 0o777, Linkname: e.link, Typeflag: tar.TypeSymlink}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// labelsOf returns the labels of the blob d.
func labelsOf(t testing.TB, cs content.Store, d digest.Digest) map[string]string {
	t.Helper()
	info, err := cs.Info(context.Background(), d)
	if err != nil {
		t.Fatalf("blob %s: %v", d, err)
	}
	return info.Labels
}

func specsVersioned() specs.Versioned { return specs.Versioned{SchemaVersion: 2} }

// sparseTar returns a tarball of one GNU sparse file (PAX format 1.0) of
// size bytes, all a hole but for one byte: a few kilobytes that read as
// size bytes. archive/tar writes no sparse file, so the blocks are made
// here.
func sparseTar(name string, size int64) []byte {
	record := func(k, v string) string {
		s := " " + k + "=" + v + "\n"
		n := len(s) + 1
		for len(strconv.Itoa(n))+len(s) != n {
			n = len(strconv.Itoa(n)) + len(s)
		}
		return strconv.Itoa(n) + s
	}
	var buf bytes.Buffer
	header := func(name string, typeflag byte, size int) {
		b := make([]byte, 512)
		copy(b, name)
		copy(b[100:], "0000644\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[136:], "00000000000\x00")
		b[156] = typeflag
		copy(b[257:], "ustar\x0000")
		copy(b[148:], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		buf.Write(b)
	}
	pad := func(n int) { buf.Write(make([]byte, (512-n%512)%512)) }
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") +
		record("GNU.sparse.realsize", strconv.FormatInt(size, 10)) + record("GNU.sparse.name", name)
	header("PaxHeaders/"+name, tar.TypeXHeader, len(pax))
	buf.WriteString(pax)
	pad(len(pax))
	sparseMap := "1\n0\n1\n" // one fragment: offset 0, 1 byte
	data := sparseMap + string(make([]byte, 512-len(sparseMap))) + "x"
	header(name, tar.TypeReg, len(data))
	buf.WriteString(data)
	pad(len(data))
	buf.Write(make([]byte, 1024))
	return buf.Bytes()
}
