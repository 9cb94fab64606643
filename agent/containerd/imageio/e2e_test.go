package imageio_test

// Differential tests against containerd's Go client, on a real containerd
// (test/e2e/env): the same tarball or registry image through the client
// in one namespace and through imageio in another must give the same
// images, the same labels on the same blobs, the same snapshots, and keep
// them through a garbage collection. They use only imageio's exported
// API, so this file moves as is to test/e2e.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/outpost-edge/outpost/agent/containerd/imageio"
	"github.com/outpost-edge/outpost/test/e2e/env"
)

const snapshotter = "overlayfs"

// side is one namespace of the daemon, worked on by the client or by
// imageio.
type side struct {
	ns  string
	cl  *client.Client
	ctx context.Context
}

func newSide(t *testing.T, ctrd *env.Containerd, ns string) side {
	t.Helper()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 2*time.Minute)
	t.Cleanup(cancel)
	return side{ns: ns, cl: ctrd.Client(t, ns), ctx: ctx}
}

// stores are the client's services as imageio's Stores.
func (s side) stores() imageio.Stores {
	return imageio.Stores{
		Content: s.cl.ContentStore(), Images: s.cl.ImageService(),
		Snapshotter: s.cl.SnapshotService(snapshotter), SnapshotterName: snapshotter,
		Applier: s.cl.DiffService(), Leases: s.cl.LeasesService(),
	}
}

// resolver is the agent's (agent/containerd/registry.go): plain HTTP to a
// registry on the loopback.
func resolver() remotes.Resolver {
	transport := docker.DefaultHTTPTransport(nil)
	transport.ResponseHeaderTimeout = time.Minute
	hc := &http.Client{Transport: transport}
	return docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(
		docker.WithClient(hc),
		docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthClient(hc))),
		docker.WithPlainHTTP(docker.MatchLocalhost),
	)})
}

// collectGarbage makes containerd collect garbage now: deleting a lease
// synchronously runs a collection before it returns.
func collectGarbage(t *testing.T, s side) {
	t.Helper()
	ls := s.cl.LeasesService()
	l, err := ls.Create(s.ctx, leases.WithRandomID())
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Delete(s.ctx, l, leases.SynchronousDelete); err != nil {
		t.Fatalf("gc: %v", err)
	}
}

// blobLabels returns every blob of the namespace with its labels.
func blobLabels(t *testing.T, s side) map[digest.Digest]map[string]string {
	t.Helper()
	all := map[digest.Digest]map[string]string{}
	err := s.cl.ContentStore().Walk(s.ctx, func(info content.Info) error {
		all[info.Digest] = info.Labels
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// snapshotChains returns the committed snapshots of the namespace, each
// with its parent.
func snapshotChains(t *testing.T, s side) map[string]string {
	t.Helper()
	all := map[string]string{}
	err := s.cl.SnapshotService(snapshotter).Walk(s.ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindCommitted {
			all[info.Name] = info.Parent
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// sameStores fails t unless the two namespaces hold the same blobs with
// the same labels, the same snapshots, and no lease. Compared after a
// garbage collection: the client's leases and imageio's are deleted at
// different times, and containerd collects when it will after each.
func sameStores(t *testing.T, what string, want, got side) {
	t.Helper()
	wantBlobs, gotBlobs := blobLabels(t, want), blobLabels(t, got)
	for d, wl := range wantBlobs {
		gl, ok := gotBlobs[d]
		switch {
		case !ok:
			t.Errorf("%s: blob %s in the client's namespace, not in imageio's", what, d)
		case !maps.Equal(wl, gl):
			t.Errorf("%s: blob %s: labels %v through imageio, %v through the client", what, d, gl, wl)
		}
	}
	for d := range gotBlobs {
		if _, ok := wantBlobs[d]; !ok {
			t.Errorf("%s: blob %s in imageio's namespace, not in the client's", what, d)
		}
	}
	if w, g := snapshotChains(t, want), snapshotChains(t, got); !maps.Equal(w, g) {
		t.Errorf("%s: snapshots %v through imageio, %v through the client", what, g, w)
	}
	for _, s := range []side{want, got} {
		if ls, err := s.cl.LeasesService().List(s.ctx); err != nil || len(ls) != 0 {
			t.Errorf("%s: namespace %s: leases %+v, %v; want none", what, s.ns, ls, err)
		}
	}
}

// sameImages fails t unless the images have the same names and targets,
// and are so recorded.
func sameImages(t *testing.T, what string, want, got []images.Image, ws, gs side) {
	t.Helper()
	brief := func(imgs []images.Image) []string {
		var out []string
		for _, i := range imgs {
			out = append(out, fmt.Sprintf("%s → %+v", i.Name, i.Target))
		}
		return out
	}
	if !slices.Equal(brief(want), brief(got)) {
		t.Errorf("%s: images\n%s\nthrough imageio,\n%s\nthrough the client", what, strings.Join(brief(got), "\n"), strings.Join(brief(want), "\n"))
	}
	for _, i := range got {
		r, err := gs.cl.ImageService().Get(gs.ctx, i.Name)
		if err != nil || r.Name != i.Name || !reflect.DeepEqual(r.Target, i.Target) {
			t.Errorf("%s: recorded %+v, %v; want %+v", what, r, err, i)
		}
	}
}

// checkUnpacked fails t unless the image's config and chain ID are the
// client's and its snapshot is there; it returns the chain ID.
func checkUnpacked(t *testing.T, s side, img images.Image) digest.Digest {
	t.Helper()
	spec, chainID, err := imageio.Config(s.ctx, s.cl.ContentStore(), img, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	want, err := client.NewImage(s.cl, img).Spec(s.ctx)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if !reflect.DeepEqual(spec, want) || chainID != identity.ChainID(want.RootFS.DiffIDs) {
		t.Errorf("%s: config %+v, chain %s; the client reads %+v", img.Name, spec, chainID, want)
	}
	if _, err := s.cl.SnapshotService(snapshotter).Stat(s.ctx, chainID.String()); err != nil {
		t.Errorf("%s: snapshot %s: %v", img.Name, chainID, err)
	}
	return chainID
}

// runOn creates a container on a snapshot prepared from chainID, and
// runs in it a command that needs the image's files.
func runOn(t *testing.T, ctrd *env.Containerd, s side, img images.Image, chainID digest.Digest) {
	t.Helper()
	id := "run-" + s.ns
	sn := s.cl.SnapshotService(snapshotter)
	if _, err := sn.Prepare(s.ctx, id, chainID.String()); err != nil {
		t.Fatalf("prepare a snapshot from %s: %v", chainID, err)
	}
	c, err := s.cl.NewContainer(s.ctx, id,
		client.WithSnapshotter(snapshotter),
		client.WithSnapshot(id),
		client.WithNewSpec(
			oci.WithImageConfig(client.NewImage(s.cl, img)),
			oci.WithProcessArgs("sh", "-c", "test -x /bin/busybox && grep -q '^root:' /etc/passwd"),
			oci.WithCgroup(ctrd.CgroupParent+"/"+id),
		))
	if err != nil {
		t.Fatalf("container on %s: %v", chainID, err)
	}
	defer c.Delete(context.WithoutCancel(s.ctx), client.WithSnapshotCleanup)
	task, err := c.NewTask(s.ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("task: %v", err)
	}
	defer task.Delete(context.WithoutCancel(s.ctx), client.WithProcessKill)
	exited, err := task.Wait(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(s.ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	select {
	case st := <-exited:
		if st.ExitCode() != 0 {
			t.Errorf("the container on %s exited %d, want 0", chainID, st.ExitCode())
		}
	case <-s.ctx.Done():
		t.Fatal("the container did not exit")
	}
}

// fileReader returns a reader of the file p's content.
// startContainerd starts a containerd for t, which -short skips: under
// qemu (make test-arm) the test binary's platform is not the daemon's.
func startContainerd(t *testing.T) *env.Containerd {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: not starting containerd")
	}
	return env.StartContainerd(t)
}

func fileReader(t *testing.T, p string) io.Reader {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(data)
}

// clientImport is what agent/containerd's ImportFile does.
func clientImport(t *testing.T, s side, r io.Reader) []images.Image {
	t.Helper()
	imgs, err := s.cl.Import(s.ctx, r, client.WithAllPlatforms(false))
	if err != nil {
		t.Fatalf("client import: %v", err)
	}
	for _, i := range imgs {
		if err := client.NewImage(s.cl, i).Unpack(s.ctx, snapshotter); err != nil {
			t.Fatalf("client unpack %s: %v", i.Name, err)
		}
	}
	return imgs
}

// TestImportAsTheClient: the test image's OCI layout tarball (an index
// of two platforms) through imageio.Import and through the client's
// Import and Unpack give the same images, blobs, labels and snapshot;
// after a garbage collection the image's blobs and snapshot are there in
// both, and a container runs on its snapshot.
func TestImportAsTheClient(t *testing.T) {
	ctrd := startContainerd(t)
	tarball := env.TestImageTarball(t)
	want, got := newSide(t, ctrd, "client"), newSide(t, ctrd, "imageio")

	wantImgs := clientImport(t, want, fileReader(t, tarball))
	gotImgs, err := imageio.Import(got.ctx, got.stores(), fileReader(t, tarball), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(gotImgs) != 1 || gotImgs[0].Name != env.TestImage {
		t.Errorf("imported %+v, want %s", gotImgs, env.TestImage)
	}
	sameImages(t, "import", wantImgs, gotImgs, want, got)
	// The client's lease, deleted first, may have been collected already.
	collectGarbage(t, got)
	sameStores(t, "import, after gc", want, got)
	checkComplete(t, got, gotImgs[0])
	chainID := checkUnpacked(t, got, gotImgs[0])
	runOn(t, ctrd, got, gotImgs[0], chainID)

	// Imported again: the same, and nothing left behind.
	if _, err := imageio.Import(got.ctx, got.stores(), fileReader(t, tarball), platforms.Default()); err != nil {
		t.Fatalf("second import: %v", err)
	}
	clientImport(t, want, fileReader(t, tarball))
	collectGarbage(t, got)
	sameStores(t, "second import, after gc", want, got)
}

// checkComplete fails t unless every blob of the image for this platform
// is in the store.
func checkComplete(t *testing.T, s side, img images.Image) {
	t.Helper()
	available, _, _, missing, err := images.Check(s.ctx, s.cl.ContentStore(), img.Target, platforms.Default())
	if err != nil || !available || len(missing) > 0 {
		t.Errorf("%s: available %v, missing %v, %v", img.Name, available, missing, err)
	}
}

// dockerArchive writes the test image for this machine as `docker save`
// does (v1.2: the uncompressed layer as <id>/layer.tar, its config as
// <id>.json, manifest.json) from the OCI layout tarball, tagged tags.
func dockerArchive(t *testing.T, ociTarball string, tags ...string) []byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(fileReader(t, ociTarball))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[path.Clean(h.Name)], _ = io.ReadAll(tr)
	}
	blob := func(d digest.Digest, v any) []byte {
		p := files[path.Join("blobs", d.Algorithm().String(), d.Encoded())]
		if v != nil {
			if err := json.Unmarshal(p, v); err != nil {
				t.Fatalf("blob %s: %v", d, err)
			}
		}
		return p
	}
	var top, idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	blob(top.Manifests[0].Digest, &idx)
	var m ocispec.Manifest
	for _, d := range idx.Manifests {
		if d.Platform.Architecture == runtime.GOARCH {
			blob(d.Digest, &m)
		}
	}
	if len(m.Layers) != 1 {
		t.Fatalf("no manifest of one layer for %s in %s", runtime.GOARCH, ociTarball)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(m.Layers[0].Digest, nil)))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	config := m.Config.Digest.Encoded() + ".json"
	layerFile := digest.FromBytes(layer).Encoded() + "/layer.tar"
	manifest, _ := json.Marshal([]map[string]any{{"Config": config, "RepoTags": tags, "Layers": []string{layerFile}}})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		data []byte
	}{{config, blob(m.Config.Digest, nil)}, {layerFile, layer}, {"manifest.json", manifest}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg})
		tw.Write(f.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportDockerArchiveAsTheClient: a docker-archive of the test image
// through imageio and through the client gives the same images (a
// normalized name per tag) and unpacks to the same snapshot; imported
// where the OCI image was unpacked before, its uncompressed layer is
// replaced by the unpacked gzip blob, by both.
func TestImportDockerArchiveAsTheClient(t *testing.T) {
	ctrd := startContainerd(t)
	tarball := env.TestImageTarball(t)
	archive := dockerArchive(t, tarball, "docker-busybox:2", "outpost.test/docker/busybox:3")
	for _, tt := range []struct {
		name     string
		ociFirst bool
	}{{"fresh", false}, {"after the OCI image", true}} {
		t.Run(tt.name, func(t *testing.T) {
			suffix := strings.ReplaceAll(tt.name, " ", "-")
			want, got := newSide(t, ctrd, "client-"+suffix), newSide(t, ctrd, "imageio-"+suffix)
			if tt.ociFirst {
				clientImport(t, want, fileReader(t, tarball))
				clientImport(t, got, fileReader(t, tarball))
			}
			wantImgs := clientImport(t, want, bytes.NewReader(archive))
			gotImgs, err := imageio.Import(got.ctx, got.stores(), bytes.NewReader(archive), platforms.Default())
			if err != nil {
				t.Fatal(err)
			}
			if len(gotImgs) != 2 || gotImgs[0].Name != "docker.io/library/docker-busybox:2" || gotImgs[1].Name != "outpost.test/docker/busybox:3" {
				t.Errorf("imported %+v, want docker.io/library/docker-busybox:2 and outpost.test/docker/busybox:3", gotImgs)
			}
			sameImages(t, "import", wantImgs, gotImgs, want, got)
			m, err := images.Manifest(got.ctx, got.cl.ContentStore(), gotImgs[0].Target, platforms.Default())
			if err != nil {
				t.Fatal(err)
			}
			if wantMT := map[bool]string{false: images.MediaTypeDockerSchema2Layer, true: images.MediaTypeDockerSchema2LayerGzip}[tt.ociFirst]; m.Layers[0].MediaType != wantMT {
				t.Errorf("layer %+v, want of media type %s", m.Layers[0], wantMT)
			}
			collectGarbage(t, got)
			sameStores(t, "import, after gc", want, got)
			for _, img := range gotImgs {
				checkComplete(t, got, img)
				checkUnpacked(t, got, img)
			}
		})
	}
}

// TestPullAsTheClient: the test image pulled from a registry through
// imageio.Pull and through the client's Pull with WithPullUnpack gives
// the same image, blobs (this platform's only), labels and snapshot; after
// a garbage collection they are there in both, and a container runs on
// the snapshot.
func TestPullAsTheClient(t *testing.T) {
	reg := env.StartRegistry(t)
	ctrd := startContainerd(t)
	ref := reg.PushTestImage(t, "imageio/busybox", "1.35")
	want, got := newSide(t, ctrd, "client"), newSide(t, ctrd, "imageio")

	pulled, err := want.cl.Pull(want.ctx, ref, client.WithResolver(resolver()), client.WithPullUnpack, client.WithPullSnapshotter(snapshotter))
	if err != nil {
		t.Fatalf("client pull: %v", err)
	}
	img, err := imageio.Pull(got.ctx, got.stores(), ref, resolver(), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != ref {
		t.Errorf("pulled %s, want %s", img.Name, ref)
	}
	sameImages(t, "pull", []images.Image{pulled.Metadata()}, []images.Image{img}, want, got)
	collectGarbage(t, got)
	sameStores(t, "pull, after gc", want, got)
	checkComplete(t, got, img)
	chainID := checkUnpacked(t, got, img)
	runOn(t, ctrd, got, img, chainID)

	// Pulled again: updated in place, nothing new.
	if _, err := imageio.Pull(got.ctx, got.stores(), ref, resolver(), platforms.Default()); err != nil {
		t.Fatalf("second pull: %v", err)
	}
	if _, err := want.cl.Pull(want.ctx, ref, client.WithResolver(resolver()), client.WithPullUnpack, client.WithPullSnapshotter(snapshotter)); err != nil {
		t.Fatalf("second client pull: %v", err)
	}
	collectGarbage(t, got)
	sameStores(t, "second pull, after gc", want, got)
}

// TestUnpackAfterGarbageCollection: an image whose snapshot containerd
// collected (its config's gc label removed) is unpacked again by Unpack,
// and kept by the label it sets.
func TestUnpackAfterGarbageCollection(t *testing.T) {
	ctrd := startContainerd(t)
	s := newSide(t, ctrd, "imageio")
	imgs, err := imageio.Import(s.ctx, s.stores(), fileReader(t, env.TestImageTarball(t)), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	img := imgs[0]
	_, chainID, err := imageio.Config(s.ctx, s.cl.ContentStore(), img, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	config, err := images.Config(s.ctx, s.cl.ContentStore(), img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	label := "containerd.io/gc.ref.snapshot." + snapshotter
	if _, err := s.cl.ContentStore().Update(s.ctx, content.Info{Digest: config.Digest}, "labels."+label); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, s)
	sn := s.cl.SnapshotService(snapshotter)
	if _, err := sn.Stat(s.ctx, chainID.String()); err == nil {
		t.Fatal("the snapshot outlived a gc without its label: this test proves nothing")
	}
	if err := imageio.Unpack(s.ctx, s.stores(), img, platforms.Default()); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, s)
	if _, err := sn.Stat(s.ctx, chainID.String()); err != nil {
		t.Errorf("after unpack and gc: snapshot %s: %v", chainID, err)
	}
	runOn(t, ctrd, s, img, chainID)
}
