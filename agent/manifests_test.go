package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/agent/staticpods"
	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// configManifest is a file with a ConfigMap and a Secret whose values are
// mode; edits below change its length, so the directory's fingerprint
// changes even within one tick of the file system's clock.
func configManifest(mode string) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-config}\ndata: {mode: " + mode + "}\n---\n" +
		"apiVersion: v1\nkind: Secret\nmetadata: {name: web-creds, namespace: edge}\nstringData: {password: " + mode + "}\n"
}

// stored returns the static config map and secret, "" where there is none.
func (f *fixture) stored(t *testing.T) (mode, password string) {
	t.Helper()
	cm, found, err := f.st.ConfigMaps().Get("default", "web-config")
	if err != nil {
		t.Fatal(err)
	}
	if found {
		if cm.Source != store.SourceStatic || cm.Object.Annotations[staticpods.AnnotationFile] != "cfg.yaml" {
			t.Fatalf("config map recorded as %s with annotations %v", cm.Source, cm.Object.Annotations)
		}
		mode = cm.Object.Data["mode"]
	}
	sec, found, err := f.st.Secrets().Get("edge", "web-creds")
	if err != nil {
		t.Fatal(err)
	}
	if found {
		if sec.Source != store.SourceStatic || sec.Object.Type != corev1.SecretTypeOpaque || sec.Object.StringData != nil {
			t.Fatalf("secret recorded as %s: %+v", sec.Source, sec.Object)
		}
		password = string(sec.Object.Data["password"])
	}
	return mode, password
}

func TestSyncManifestsFollowsConfigMapsAndSecrets(t *testing.T) {
	f := newFixture(t)
	sync := func(step string) {
		t.Helper()
		if err := f.agent.SyncManifests(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	f.write(t, "cfg.yaml", configManifest("a"))
	f.write(t, "web.yaml", pod("web", "busybox:1"))
	sync("first read")
	if mode, pw := f.stored(t); mode != "a" || pw != "a" {
		t.Fatalf("recorded mode=%q password=%q", mode, pw)
	}

	f.write(t, "cfg.yaml", configManifest("bb"))
	sync("edit")
	if mode, pw := f.stored(t); mode != "bb" || pw != "bb" {
		t.Fatalf("edit not recorded: mode=%q password=%q", mode, pw)
	}

	// A broken edit keeps both objects of the file and is reported, while
	// another file's edit still goes through.
	f.write(t, "cfg.yaml", strings.Replace(configManifest("ccc"), "{mode: ccc}", "{mode: ccc, bad/key: x}", 1))
	f.write(t, "web.yaml", pod("web", "busybox:22"))
	sync("broken edit")
	if mode, pw := f.stored(t); mode != "bb" || pw != "bb" {
		t.Fatalf("broken edit changed the stored objects: mode=%q password=%q", mode, pw)
	}
	if got := f.podImages(t); got["web-n1"] != "busybox:22" {
		t.Fatalf("other file's edit not recorded: %v", got)
	}
	s, _ := f.agent.Status()
	if len(s.Agent.ManifestErrors) != 1 || !strings.Contains(s.Agent.ManifestErrors[0], `cfg.yaml: document 1 (ConfigMap web-config): data["bad/key"]: is invalid`) {
		t.Fatalf("manifest errors = %q", s.Agent.ManifestErrors)
	}

	// Fixing the file applies it and clears the error.
	f.write(t, "cfg.yaml", configManifest("dddd"))
	sync("fix")
	if mode, pw := f.stored(t); mode != "dddd" || pw != "dddd" {
		t.Fatalf("fix not recorded: mode=%q password=%q", mode, pw)
	}
	if s, _ := f.agent.Status(); len(s.Agent.ManifestErrors) != 0 {
		t.Fatalf("manifest errors after fix = %q", s.Agent.ManifestErrors)
	}

	// A removed file deletes its objects and leaves the others.
	if err := os.Remove(filepath.Join(f.dir, "cfg.yaml")); err != nil {
		t.Fatal(err)
	}
	sync("remove")
	if mode, pw := f.stored(t); mode != "" || pw != "" {
		t.Fatalf("removed file's objects kept: mode=%q password=%q", mode, pw)
	}
	if got := f.podImages(t); len(got) != 1 {
		t.Fatalf("pods = %v", got)
	}
}

func TestSyncManifestsLeavesOtherSourcesConfigMaps(t *testing.T) {
	f := newFixture(t)
	api := &corev1.ConfigMap{}
	api.Namespace, api.Name, api.Data = "default", "from-api", map[string]string{"k": "v"}
	if err := f.st.ConfigMaps().Put(store.SourceAPI, api); err != nil {
		t.Fatal(err)
	}
	f.write(t, "cfg.yaml", configManifest("a"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(f.dir, "cfg.yaml"))
	if err := f.agent.SyncManifests(); err != nil {
		t.Fatal(err)
	}
	recs, err := f.st.ConfigMaps().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Source != store.SourceAPI || recs[0].Object.Name != "from-api" {
		t.Fatalf("config maps = %+v", recs)
	}
}
