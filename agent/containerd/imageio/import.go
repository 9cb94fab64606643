package imageio

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/reference"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// jsonLimit bounds the oci-layout and manifest.json files of an archive,
// as containerd's importer does.
const jsonLimit = 20 << 20

// Import reads an OCI image layout tarball or a docker-archive tarball
// (docker save), writes its blobs to the content store, records its named
// images and unpacks each for platform (nil: this machine's), as
// client.Import(ctx, r, WithAllPlatforms(false)) followed by an Unpack of
// each image does, all under one lease. An image is named by its index
// entry's io.containerd.image.name annotation, else its
// org.opencontainers.image.ref.name, normalized (see Normalize); a
// docker-archive's RepoTags become those annotations. When an unpack
// fails, Import returns the images recorded (they stay in the store) with
// the error.
func Import(ctx context.Context, s Stores, r io.Reader, platform platforms.MatchComparer) ([]images.Image, error) {
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	platform = orDefault(platform)
	ctx, done, err := withLease(ctx, s.Leases)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer done()
	imgs, err := load(ctx, s.Content, s.Images, r, platform)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	for _, img := range imgs {
		if err := unpackImage(ctx, s, img, platform); err != nil {
			return imgs, fmt.Errorf("import: unpack %s: %w", img.Name, err)
		}
	}
	return imgs, nil
}

// load is Import without the lease and the unpacks: the archive's blobs
// into cs, the gc labels from its index down for platform, and its named
// images into is.
func load(ctx context.Context, cs content.Store, is images.Store, r io.Reader, platform platforms.MatchComparer) ([]images.Image, error) {
	index, file, err := importIndex(ctx, cs, r)
	if err != nil {
		return nil, err
	}
	imgs, err := labelAndName(ctx, cs, index, file, platform)
	if err != nil {
		return nil, err
	}
	// client/import.go: update the target of an image that is there,
	// else create it.
	for i := range imgs {
		img, err := is.Update(ctx, imgs[i], "target")
		if err != nil {
			if !errdefs.IsNotFound(err) {
				return nil, fmt.Errorf("image %s: %w", imgs[i].Name, err)
			}
			if img, err = is.Create(ctx, imgs[i]); err != nil {
				return nil, fmt.Errorf("image %s: %w", imgs[i].Name, err)
			}
		}
		imgs[i] = img
	}
	return imgs, nil
}

// labelAndName walks the image index of an archive as client.Import does:
// it names an image for each entry of the index with a name (whatever its
// platform), and sets the gc labels of every index and manifest blob it
// reaches through entries for platform. Unlike the client, it fails on a
// descriptor with an invalid digest instead of labelling it (or, for a
// referrer, panicking). file names the index in errors.
func labelAndName(ctx context.Context, cs content.Store, index ocispec.Descriptor, file string, platform platforms.MatchComparer) ([]images.Image, error) {
	var imgs []images.Image
	children := checkedChildren(cs)
	var handler images.HandlerFunc = func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if desc.Digest != index.Digest {
			return children(ctx, desc)
		}
		var idx ocispec.Index
		if err := readJSON(ctx, cs, desc, &idx); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		for i, m := range idx.Manifests {
			name := imageName(m.Annotations)
			if name == "" {
				continue
			}
			normalized, err := Normalize(name)
			if err != nil {
				return nil, fmt.Errorf("%s: manifests[%d].annotations: %w", file, i, err)
			}
			imgs = append(imgs, images.Image{Name: normalized, Target: m})
		}
		return idx.Manifests, checkDigests(file, func(i int) string { return fmt.Sprintf("manifests[%d]", i) }, idx.Manifests)
	}
	handler = images.FilterPlatforms(handler, platform)
	handler = images.SetChildrenLabels(cs, handler)
	if err := images.WalkNotEmpty(ctx, handler, index); err != nil {
		if errors.Is(err, images.ErrEmptyWalk) {
			return nil, fmt.Errorf("%s: no image for the platform: %w", file, err)
		}
		return nil, err
	}
	return imgs, nil
}

// checkedChildren is images.ChildrenHandler, failing on a child with an
// invalid digest instead of passing it on: to SetChildrenMappedLabels,
// which panics on a referrer's (images.ChildGCLabels).
func checkedChildren(cs content.Provider) images.HandlerFunc {
	return func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		blob := kind(desc.MediaType) + " " + desc.Digest.String()
		children, err := images.Children(ctx, cs, desc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", blob, err)
		}
		field := func(i int) string { return fmt.Sprintf("manifests[%d]", i) }
		if images.IsManifestType(desc.MediaType) {
			// images.Children puts the config first.
			field = func(i int) string {
				if i == 0 {
					return "config"
				}
				return fmt.Sprintf("layers[%d]", i-1)
			}
		}
		return children, checkDigests(blob, field, children)
	}
}

// checkDigests fails on a child descriptor of parent whose digest is not
// valid, naming it by field(i): a digest becomes a label value and a path
// in the content store.
func checkDigests(parent string, field func(int) string, descs []ocispec.Descriptor) error {
	for i, d := range descs {
		if err := d.Digest.Validate(); err != nil {
			return fmt.Errorf("%s: %s.digest %q: %w", parent, field(i), d.Digest, err)
		}
	}
	return nil
}

// kind names a blob by its media type in errors.
func kind(mediaType string) string {
	switch {
	case images.IsIndexType(mediaType):
		return "index"
	case images.IsManifestType(mediaType):
		return "manifest"
	case images.IsKnownConfig(mediaType):
		return "config"
	case images.IsLayerType(mediaType):
		return "layer"
	}
	return "blob"
}

// imageName is client/import.go's imageName without a translator.
func imageName(annotations map[string]string) string {
	if name := annotations[images.AnnotationImageName]; name != "" {
		return name
	}
	return annotations[ocispec.AnnotationRefName]
}

// dockerManifest is an entry of a docker-archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// importIndex writes the archive's files to cs and returns its image
// index: an OCI layout's index.json, or one it writes for a docker
// archive's manifest.json; and the name of that file, for errors. It is
// core/images/archive's ImportIndex (v2.2.9) without
// WithImportCompression, its errors naming the file or field at fault,
// and refusing sparse files.
func importIndex(ctx context.Context, cs content.Store, r io.Reader) (ocispec.Descriptor, string, error) {
	var (
		tr       = tar.NewReader(r)
		layout   ocispec.ImageLayout
		mfsts    []dockerManifest
		symlinks = map[string]string{}
		blobs    = map[string]ocispec.Descriptor{}
		last     string // the last file read, for errors
	)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if last == "" {
				return ocispec.Descriptor{}, "", fmt.Errorf("read tar: %w", err)
			}
			return ocispec.Descriptor{}, "", fmt.Errorf("read tar after %q: %w", last, err)
		}
		last = hdr.Name
		if hdr.Typeflag == tar.TypeSymlink {
			symlinks[hdr.Name] = path.Join(path.Dir(hdr.Name), hdr.Linkname)
		}
		// The tar reader reports the old TypeRegA as TypeReg.
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		// A sparse file's holes are read as zeros: a few bytes of
		// archive could fill the disk. No image tool writes one.
		for k := range hdr.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				return ocispec.Descriptor{}, "", fmt.Errorf("%s: a sparse file (PAX record %s): not in an image archive", hdr.Name, k)
			}
		}
		name := path.Clean(hdr.Name)
		switch name {
		case ocispec.ImageLayoutFile:
			if err := decodeJSON(tr, &layout); err != nil {
				return ocispec.Descriptor{}, "", fmt.Errorf("%s: %w", hdr.Name, err)
			}
		case "manifest.json":
			if err := decodeJSON(tr, &mfsts); err != nil {
				return ocispec.Descriptor{}, "", fmt.Errorf("%s: %w", hdr.Name, err)
			}
		default:
			dgst, err := writeFile(ctx, cs, tr, hdr.Size, "tar-"+name)
			if err != nil {
				return ocispec.Descriptor{}, "", fmt.Errorf("%s: %w", hdr.Name, err)
			}
			blobs[name] = ocispec.Descriptor{Digest: dgst, Size: hdr.Size}
		}
	}

	// An OCI layout when there is an oci-layout file, else a docker
	// archive (v1.1, v1.2).
	if layout.Version != "" {
		if layout.Version != ocispec.ImageLayoutVersion {
			return ocispec.Descriptor{}, "", fmt.Errorf("%s: imageLayoutVersion %q: want %q", ocispec.ImageLayoutFile, layout.Version, ocispec.ImageLayoutVersion)
		}
		idx, ok := blobs[ocispec.ImageIndexFile]
		if !ok {
			return ocispec.Descriptor{}, "", fmt.Errorf("%s: not in the OCI layout", ocispec.ImageIndexFile)
		}
		idx.MediaType = ocispec.MediaTypeImageIndex
		return idx, ocispec.ImageIndexFile, nil
	}
	if mfsts == nil {
		return ocispec.Descriptor{}, "", errors.New("neither an OCI layout (oci-layout) nor a docker archive (manifest.json)")
	}
	for name, target := range symlinks {
		desc, ok := blobs[target]
		if !ok {
			return ocispec.Descriptor{}, "", fmt.Errorf("symlink %s: no file %s", name, target)
		}
		blobs[name] = desc
	}
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}}
	for i, mfst := range mfsts {
		desc, err := dockerImage(ctx, cs, fmt.Sprintf("manifest.json: [%d]", i), mfst, blobs)
		if err != nil {
			return ocispec.Descriptor{}, "", err
		}
		if len(mfst.RepoTags) == 0 {
			idx.Manifests = append(idx.Manifests, desc)
			continue
		}
		// A descriptor per tag.
		for j, ref := range mfst.RepoTags {
			normalized, err := Normalize(ref)
			if err != nil {
				return ocispec.Descriptor{}, "", fmt.Errorf("manifest.json: [%d].RepoTags[%d]: %w", i, j, err)
			}
			d := desc
			d.Annotations = map[string]string{
				images.AnnotationImageName: normalized,
				ocispec.AnnotationRefName:  ociReferenceName(normalized),
			}
			idx.Manifests = append(idx.Manifests, d)
		}
	}
	desc, err := writeJSON(ctx, cs, idx, ocispec.MediaTypeImageIndex)
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("manifest.json: index: %w", err)
	}
	return desc, "manifest.json", nil
}

// dockerImage writes the docker manifest of one entry of a docker
// archive's manifest.json, named entry in errors, and returns its
// descriptor, with the platform of its config.
func dockerImage(ctx context.Context, cs content.Store, entry string, mfst dockerManifest, blobs map[string]ocispec.Descriptor) (ocispec.Descriptor, error) {
	config, ok := blobs[mfst.Config]
	if !ok {
		return ocispec.Descriptor{}, fmt.Errorf("%s.Config %q: not in the archive", entry, mfst.Config)
	}
	config.MediaType = images.MediaTypeDockerSchema2Config
	layers, err := resolveLayers(ctx, cs, entry, mfst.Layers, blobs)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	// The client's fields in the client's order: the same digest.
	manifest := struct {
		SchemaVersion int                  `json:"schemaVersion"`
		MediaType     string               `json:"mediaType"`
		Config        ocispec.Descriptor   `json:"config"`
		Layers        []ocispec.Descriptor `json:"layers"`
	}{
		SchemaVersion: 2,
		MediaType:     images.MediaTypeDockerSchema2Manifest,
		Config:        config,
		Layers:        layers,
	}
	desc, err := writeJSON(ctx, cs, manifest, manifest.MediaType)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s: write manifest: %w", entry, err)
	}
	ps, err := images.Platforms(ctx, cs, desc)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s.Config %q: platform: %w", entry, mfst.Config, err)
	}
	if len(ps) > 0 {
		// A manifest has one platform, its config's; a config without
		// one leaves it unset.
		desc.Platform = &ps[0]
		// A Windows image without an OS version is taken to be this
		// machine's (containerd issue 5690).
		if desc.Platform.OS == "windows" && desc.Platform.OSVersion == "" {
			desc.Platform.OSVersion = platforms.DefaultSpec().OSVersion
		}
	}
	return desc, nil
}

// resolveLayers returns the descriptors of the layer files of a docker
// archive's manifest.json entry: an uncompressed layer is replaced by a
// blob in the store labelled as its compression
// (containerd.io/uncompressed), and a layer's media type is the docker
// one of its compression. As the client's, of layers that are the same
// file only the last is replaced, by the last such blob the walk finds.
func resolveLayers(ctx context.Context, cs content.Store, entry string, files []string, blobs map[string]ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	layers := make([]ocispec.Descriptor, len(files))
	byDigest := map[digest.Digest]int{}
	filters := make([]string, len(files))
	for i, f := range files {
		desc, ok := blobs[f]
		if !ok {
			return nil, fmt.Errorf("%s.Layers[%d] %q: not in the archive", entry, i, f)
		}
		layers[i] = desc
		byDigest[desc.Digest] = i
		filters[i] = fmt.Sprintf("labels.%q==%s", labels.LabelUncompressed, desc.Digest)
	}
	var err error
	if len(files) > 0 { // no filter would walk every blob
		err = cs.Walk(ctx, func(info content.Info) error {
			uncompressed, ok := info.Labels[labels.LabelUncompressed]
			if !ok {
				return nil
			}
			i, ok := byDigest[digest.Digest(uncompressed)]
			if !ok {
				return nil
			}
			compressed := ocispec.Descriptor{Digest: info.Digest, Size: info.Size}
			mt, err := layerMediaType(ctx, cs, compressed)
			if err != nil {
				return fmt.Errorf("%s.Layers[%d] %q: compressed blob %s: %w", entry, i, files[i], info.Digest, err)
			}
			compressed.MediaType = mt
			layers[i] = compressed
			return nil
		}, filters...)
	}
	if err != nil {
		return nil, fmt.Errorf("%s.Layers: compressed blobs: %w", entry, err)
	}
	for i, desc := range layers {
		if desc.MediaType != "" {
			continue
		}
		mt, err := layerMediaType(ctx, cs, desc)
		if err != nil {
			return nil, fmt.Errorf("%s.Layers[%d] %q: %w", entry, i, files[i], err)
		}
		layers[i].MediaType = mt
	}
	return layers, nil
}

// layerMediaType returns the docker media type of a layer blob by its
// first bytes: uncompressed, or gzip (for any compression, as
// containerd's importer does). An empty blob is an uncompressed layer.
func layerMediaType(ctx context.Context, cs content.Provider, desc ocispec.Descriptor) (string, error) {
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return "", err
	}
	defer ra.Close()
	head := make([]byte, 10)
	n, err := ra.ReadAt(head, 0)
	if err != nil && err != io.EOF {
		return "", err
	}
	if compression.DetectCompression(head[:n]) == compression.Uncompressed {
		return images.MediaTypeDockerSchema2Layer, nil
	}
	return images.MediaTypeDockerSchema2LayerGzip, nil
}

// ociReferenceName is the OCI ref name of a normalized image name: its
// tag or @digest (core/images/archive's ociReferenceName).
func ociReferenceName(name string) string {
	if spec, err := reference.Parse(name); err == nil {
		return spec.Object
	}
	return name
}

// decodeJSON decodes the first JSON value of r, reading at most
// jsonLimit bytes.
func decodeJSON(r io.Reader, v any) error {
	return json.NewDecoder(io.LimitReader(r, jsonLimit)).Decode(v)
}

// writeFile writes size bytes of r to cs as a blob and returns its
// digest (core/images/archive's onUntarBlob).
func writeFile(ctx context.Context, cs content.Ingester, r io.Reader, size int64, ref string) (digest.Digest, error) {
	d := digest.Canonical.Digester()
	if err := content.WriteBlob(ctx, cs, ref, io.TeeReader(r, d.Hash()), ocispec.Descriptor{Size: size}); err != nil {
		return "", err
	}
	return d.Digest(), nil
}

// writeJSON writes v as JSON to cs and returns its descriptor.
func writeJSON(ctx context.Context, cs content.Ingester, v any, mediaType string) (ocispec.Descriptor, error) {
	p, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(p), Size: int64(len(p))}
	if err := content.WriteBlob(ctx, cs, "manifest-"+desc.Digest.String(), bytes.NewReader(p), desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
}
