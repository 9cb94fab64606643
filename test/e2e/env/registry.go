package env

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"
)

// Registry is a private OCI distribution registry (distribution's
// `registry`, the one behind most registries people run) serving plain
// HTTP on a free loopback port, with its storage in a temp dir.
type Registry struct {
	// Host is 127.0.0.1:PORT, the registry part of the references of the
	// images it serves.
	Host string
	// URL is http://127.0.0.1:PORT.
	URL string

	proc *process
}

// StartRegistry starts a registry on a free loopback port with storage in
// a temp dir and a config file it writes, waits for /v2/ to answer, and
// stops it in t's cleanup. It skips t when not root, and fails it when
// the registry binary is missing (`make testenv` builds it).
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	RequireRoot(t)
	bin := filepath.Join(ToolsDir(), "bin", "registry")
	if _, err := os.Stat(bin); err != nil {
		// As root the environment is expected: a missing tool is a
		// failure, not a reason to pass.
		t.Fatalf("registry not found at %s: run `make testenv` (as root) to build it", bin)
	}
	dir := t.TempDir()
	port := FreePort(t)
	r := &Registry{Host: "127.0.0.1:" + strconv.Itoa(port)}
	r.URL = "http://" + r.Host
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  secret: outpost-e2e
`, filepath.Join(dir, "storage"), r.Host)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r.proc = start(t, dir, "registry", bin, "serve", cfgPath)
	client := &http.Client{Timeout: 2 * time.Second}
	waitReady(t, r.proc, 30*time.Second, func() error { return httpOK(client, r.URL+"/v2/", "") })
	return r
}

// Stop stops the registry before the test ends, as a registry out of
// reach; the test's cleanup then has nothing left to stop.
func (r *Registry) Stop() { r.proc.stop() }

// Ref returns the reference of repo:tag in the registry.
func (r *Registry) Ref(repo, tag string) string { return r.Host + "/" + repo + ":" + tag }

// PushTestImage pushes the test image (both architectures, as
// TestImageTarball holds it) to the registry as repo:tag, over the OCI
// distribution API, and returns its reference.
func (r *Registry) PushTestImage(t testing.TB, repo, tag string) string {
	t.Helper()
	l, err := buildTestImage(busyboxBinaries(t), ImageConfig{Cmd: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Ref(repo, tag)
	if err := r.push(repo, tag, l); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// push uploads the layout's blobs (layers and configs), then its image
// manifests by digest, then the index as tag: a registry accepts a
// manifest only once what it references is there.
func (r *Registry) push(repo, tag string, l *layout) error {
	c := &http.Client{Timeout: 30 * time.Second}
	manifests := map[string]bool{l.index.Digest: true}
	for _, m := range l.manifests {
		manifests[m.Digest] = true
	}
	digests := make([]string, 0, len(l.blobs))
	for d := range l.blobs {
		if !manifests[d] {
			digests = append(digests, d)
		}
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := r.uploadBlob(c, repo, d, l.blobs[d]); err != nil {
			return err
		}
	}
	for _, m := range l.manifests {
		if err := r.putManifest(c, repo, m.Digest, m.MediaType, l.blobs[m.Digest]); err != nil {
			return err
		}
	}
	return r.putManifest(c, repo, tag, l.index.MediaType, l.blobs[l.index.Digest])
}

// uploadBlob uploads one blob monolithically: POST opens an upload, PUT
// to its location with the digest completes it. A blob the registry has
// is skipped.
func (r *Registry) uploadBlob(c *http.Client, repo, digest string, data []byte) error {
	resp, err := c.Head(r.URL + "/v2/" + repo + "/blobs/" + digest)
	if err != nil {
		return fmt.Errorf("blob %s: %w", digest, err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	resp, err = c.Post(r.URL+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		return fmt.Errorf("start upload of blob %s: %w", digest, err)
	}
	if err := wantStatus(resp, http.StatusAccepted); err != nil {
		return fmt.Errorf("start upload of blob %s: %w", digest, err)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return fmt.Errorf("upload of blob %s: location: %w", digest, err)
	}
	base, _ := url.Parse(r.URL)
	u := base.ResolveReference(loc)
	q := u.Query()
	q.Set("digest", digest)
	u.RawQuery = q.Encode()
	req, err := http.NewRequest(http.MethodPut, u.String(), bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = c.Do(req)
	if err != nil {
		return fmt.Errorf("upload blob %s: %w", digest, err)
	}
	if err := wantStatus(resp, http.StatusCreated); err != nil {
		return fmt.Errorf("upload blob %s: %w", digest, err)
	}
	return nil
}

// putManifest puts a manifest or index as reference (a digest or a tag).
func (r *Registry) putManifest(c *http.Client, repo, reference, mediaType string, data []byte) error {
	req, err := http.NewRequest(http.MethodPut, r.URL+"/v2/"+repo+"/manifests/"+reference, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mediaType)
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("put manifest %s: %w", reference, err)
	}
	if err := wantStatus(resp, http.StatusCreated); err != nil {
		return fmt.Errorf("put manifest %s: %w", reference, err)
	}
	return nil
}

// wantStatus closes resp's body and fails unless it has status code want.
func wantStatus(resp *http.Response, want int) error {
	defer resp.Body.Close()
	if resp.StatusCode == want {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
}
