package imageio

import (
	"fmt"
	"strings"
	"testing"

	"github.com/distribution/reference"
)

const hex64 = "7cc4b5aefd1d0cadf8d97d4350462ba51c694ebca145b08d7d41b41acc8db5aa"

func TestNormalize(t *testing.T) {
	for _, tt := range []struct {
		ref, want string
	}{
		{"busybox", "docker.io/library/busybox:latest"},
		{"busybox:1.36", "docker.io/library/busybox:1.36"},
		{"library/busybox", "docker.io/library/busybox:latest"},
		{"docker.io/busybox", "docker.io/library/busybox:latest"},
		{"index.docker.io/busybox:1", "docker.io/library/busybox:1"},
		{"index.docker.io/someone/app", "docker.io/someone/app:latest"},
		{"someone/app:v2", "docker.io/someone/app:v2"},
		{"someone/team/app", "docker.io/someone/team/app:latest"},
		{"ghcr.io/someone/app", "ghcr.io/someone/app:latest"},
		{"ghcr.io/app", "ghcr.io/app:latest"},
		{"localhost/app", "localhost/app:latest"},
		{"localhost:5000/app:v1", "localhost:5000/app:v1"},
		{"127.0.0.1:5000/smoke/busybox:1.35", "127.0.0.1:5000/smoke/busybox:1.35"},
		{"[::1]:5000/app", "[::1]:5000/app:latest"},
		{"[fe80::1]/app:x", "[fe80::1]/app:x"},
		{"Registry/app", "Registry/app:latest"},
		{"outpost.test/busybox:1.35", "outpost.test/busybox:1.35"},
		{"a-b/c__d/e--f.g_h:T_a-g.1", "docker.io/a-b/c__d/e--f.g_h:T_a-g.1"},
		{"busybox@sha256:" + hex64, "docker.io/library/busybox@sha256:" + hex64},
		// A tag and a digest: the digest alone.
		{"busybox:1.36@sha256:" + hex64, "docker.io/library/busybox@sha256:" + hex64},
		{"localhost:5000/app:v1@sha256:" + hex64, "localhost:5000/app@sha256:" + hex64},
		{"localhost:5000", "docker.io/library/localhost:5000"},
		{hex64[:63], "docker.io/library/" + hex64[:63] + ":latest"},
		{"x/" + strings.Repeat("a", 253), "docker.io/x/" + strings.Repeat("a", 253) + ":latest"},
	} {
		t.Run(tt.ref, func(t *testing.T) {
			got, err := Normalize(tt.ref)
			if err != nil || got != tt.want {
				t.Errorf("Normalize(%q) = %q, %v; want %q", tt.ref, got, err, tt.want)
			}
		})
	}
}

func TestNormalizeInvalid(t *testing.T) {
	for _, tt := range []struct {
		ref, want string // want: in the error
	}{
		{"", "invalid reference format"},
		{hex64, "64-byte hexadecimal"},
		{"Busybox", "must be lowercase"},
		{"someone/App", "must be lowercase"},
		{"busybox:", "invalid reference format"},
		{"busybox:-x", "invalid reference format"},
		{"busybox:" + strings.Repeat("t", 129), "invalid reference format"},
		{"busy..box", "invalid reference format"},
		{"busy._box", "invalid reference format"},
		{"busybox.", "invalid reference format"},
		{"-busybox", "invalid reference format"},
		{"a//b", "invalid reference format"},
		{"ghcr.io/", "invalid reference format"},
		{"ghcr.io:x/app", "invalid reference format"},
		{"[::1/app", "invalid reference format"},
		{"[]/app", "invalid reference format"},
		{"-ghcr.io/app", "invalid reference format"},
		{"busybox@sha256:abc", "invalid reference format"},
		{"busybox@sha256:" + hex64 + "0", "invalid checksum digest length"},
		{"busybox@md5:" + hex64[:32], "unsupported digest algorithm"},
		{"busybox@sha256:" + strings.ToUpper(hex64), "invalid checksum digest format"},
		{"busybox@@sha256:" + hex64, "invalid reference format"},
		{"x/" + strings.Repeat("a", 254), "must not be more than 255 characters"},
		{"busybox\x00", "invalid reference format"},
		{"ünicode", "invalid reference format"},
	} {
		t.Run(tt.ref, func(t *testing.T) {
			got, err := Normalize(tt.ref)
			if err == nil {
				t.Fatalf("Normalize(%q) = %q, want an error", tt.ref, got)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.ref)) {
				t.Errorf("Normalize(%q): %v; want an error naming the reference and saying %q", tt.ref, err, tt.want)
			}
		})
	}
}

// parseDockerRef is what Normalize follows.
func parseDockerRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}

// checkAgainstReference fails t if Normalize and distribution/reference
// disagree on ref: on its normalized form, or on whether it is valid.
func checkAgainstReference(t *testing.T, ref string) {
	t.Helper()
	want, wantErr := parseDockerRef(ref)
	got, err := Normalize(ref)
	if (err != nil) != (wantErr != nil) || got != want {
		t.Errorf("Normalize(%q) = %q, %v; distribution/reference gives %q, %v", ref, got, err, want, wantErr)
	}
}

// TestNormalizeAsDistributionReference compares Normalize with
// distribution/reference's ParseDockerRef over the references its own
// tests use and every combination of domains, paths, tags and digests,
// valid and not.
func TestNormalizeAsDistributionReference(t *testing.T) {
	refs := []string{
		"", ":", "@", "/", ":/", "a:", "a@", "a/", "/a", "a:b:c", "a@b@c", "a:b@c", ":latest",
		"test_com", "test.com:tag", "test.com:5000", "test.com/repo:tag", "test:5000/repo", "test:5000/repo:tag",
		"lowercase:Uppercase", "Uppercase:tag", "test:5000/Uppercase/lowercase:tag", "lowercase:5000/Uppercase/lowercase:tag",
		"aa/asdf$$^/aa", "a/a/a/a/a/a/a/a/a/a/a/a/a", "foo_bar.com:8080", "foo/foo_bar.com:8080",
		"192.168.1.1", "192.168.1.1:tag", "192.168.1.1:5000", "192.168.1.1/repo", "192.168.1.1:5000/repo", "192.168.1.1:5000/repo:5050",
		"a..b/c", "a--b/c", "a__b/c", "a___b/c", "a-/b", "a./b", "a_/b", "_a/b", ".a/b",
		"[2001:db8::1]", "[2001:db8::1]:5000", "[2001:db8::1]:tag", "[2001:db8::1]/repo", "[2001:db8::1]:5000/repo:tag",
		"[2001:db8::]:5000/repo", "[::1]:5000/repo", "[fe80::1%eth0]:5000/repo", "[fe80::1%@invalidzone]:5000/repo",
		"[2001:db8:1:2:3:4:5:6]/repo:tag", "[2001:db8::1]:/repo", "[::ffff:192.168.1.1]/repo",
		"localhost", "localhost:5000", "localhost/repo", "localhost:5000/repo:tag", "LOCALHOST/repo", "Localhost:5000/repo",
		"index.docker.io/library/foo", "index.docker.io/foo", "docker.io/foo/bar:baz", "INDEX.docker.io/foo", "docker.io",
		"sub-dom1.foo.com/bar/baz/quux", "sub-dom1.foo.com/bar/baz/quux:some-long-tag", "b.gcr.io/test.example.com/my-app:test.example.com",
		"xn--n3h.com/myimage:xn--n3h.com", "xn--7o8h.com/myimage:xn--7o8h.com@sha512:" + strings.Repeat("f", 128),
		"foo_bar.com:8080", "docker.io/library/busybox@sha256:" + hex64, "busybox@sha256:" + hex64 + "@sha256:" + hex64,
		"a@sha256+b64u:" + strings.Repeat("a", 43), "a@sha512:" + strings.Repeat("0", 128), "a@sha384:" + strings.Repeat("0", 96),
		"a@SHA256:" + hex64, "a@sha-256:" + hex64, "a@sha256-:" + hex64, "a@9ha256:" + hex64, "a@sha256:" + hex64[:31], "a@sha256:" + hex64[:32],
		hex64, hex64 + ":tag", "a/" + hex64, strings.ToUpper(hex64), hex64[:63],
		strings.Repeat("a", 255), "a/" + strings.Repeat("a", 253), "a/" + strings.Repeat("a", 254), "a.com/" + strings.Repeat("a", 255), "a.com/" + strings.Repeat("a", 256),
		"a:" + strings.Repeat("t", 128), "a:" + strings.Repeat("t", 129), "a:_t", "a:.t", "a:-t", "a:t.-_",
		"ﬃ", "busyboxΣ", "Σ/busybox", "busybox:tagΣ", "\xff", "a/\xff", "\xff/a", "a\x00", " a", "a ", "a\n",
		"-a.com/b", "a-.com/b", "a.-b.com/c", "a.com./b", ".a.com/b", "a.com:/b", "a.com:99999999999999999999/b", "a.com::1/b",
		"a__b__c/d", "a/b__c", "a/b___c", "a/b-.c", "a/b.-c", "a/b..c", "a/b_.c",
	}
	domains := []string{"", "docker.io/", "index.docker.io/", "localhost/", "localhost:5000/", "Registry/", "registry/", "r.io/", "r.io:80/", "[::1]/", "[::1]:443/", "r_io/", "R.IO/"}
	paths := []string{"busybox", "library/busybox", "a/b/c", "a-b", "a.b", "a_b", "a__b", "a---b", "A", "a..b", "a/", "0", ""}
	tags := []string{"", ":latest", ":1.36", ":V_1-x.y", ":", ":-x", ":x/y"}
	digests := []string{"", "@sha256:" + hex64, "@sha256:" + hex64[:10], "@sha512:" + hex64, "@x:" + hex64[:32]}
	for _, d := range domains {
		for _, p := range paths {
			for _, tag := range tags {
				for _, dg := range digests {
					refs = append(refs, d+p+tag+dg)
				}
			}
		}
	}
	for _, ref := range refs {
		checkAgainstReference(t, ref)
	}
}

// FuzzNormalize compares Normalize with distribution/reference's
// ParseDockerRef on any input.
func FuzzNormalize(f *testing.F) {
	for _, seed := range []string{
		"busybox", "docker.io/library/busybox:latest", "localhost:5000/a/b:c", "[::1]:5000/a@sha256:" + hex64,
		"Registry/app:T", "a__b/c--d.e_f", "index.docker.io/x", hex64, "a:b@sha512:" + strings.Repeat("0", 128),
	} {
		f.Add(seed)
	}
	f.Fuzz(checkAgainstReference)
}
