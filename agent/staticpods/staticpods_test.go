package staticpods

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const webPod = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: httpd
    image: outpost.test/busybox:1
    command: [httpd, -f, -p, "8080"]
`

func TestParsePodLikeKubelet(t *testing.T) {
	pods, svcs, errs := Parse("web.yaml", []byte(webPod), "pi-17")
	if len(errs) > 0 || len(pods) != 1 || len(svcs) != 0 {
		t.Fatalf("pods=%d svcs=%d errs=%v", len(pods), len(svcs), errs)
	}
	p := pods[0]
	if p.Name != "web-pi-17" || p.Namespace != "default" || p.Spec.NodeName != "pi-17" {
		t.Fatalf("name/ns/node = %s/%s/%s", p.Namespace, p.Name, p.Spec.NodeName)
	}
	if p.Annotations[AnnotationSource] != "file" || p.Annotations[AnnotationFile] != "web.yaml" || p.Annotations[AnnotationHash] != string(p.UID) {
		t.Fatalf("annotations = %v, uid %s", p.Annotations, p.UID)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyAlways || *p.Spec.TerminationGracePeriodSeconds != 30 || p.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
		t.Fatalf("defaults not applied: %+v", p.Spec)
	}
	again, _, _ := Parse("web.yaml", []byte(webPod), "pi-17")
	if again[0].UID != p.UID {
		t.Fatal("UID not stable across reads")
	}
	changed, _, _ := Parse("web.yaml", []byte(strings.Replace(webPod, "8080", "8081", 1)), "pi-17")
	if changed[0].UID == p.UID {
		t.Fatal("UID did not change with the manifest")
	}
}

func TestParseErrorsNameFileDocumentFieldAndLine(t *testing.T) {
	src := webPod + `---
apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  containers:
  - name: c
    image: ""
---
apiVersion: apps/v1
kind: Deployment
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ports: [{port: 80, protocl: TCP}]
`
	pods, svcs, errs := Parse("mixed.yaml", []byte(src), "n")
	if len(pods) != 1 || len(svcs) != 0 {
		t.Fatalf("good pod not kept: pods=%d svcs=%d", len(pods), len(svcs))
	}
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	got := strings.Join(all, "\n")
	for _, want := range []string{
		"mixed.yaml: document 2 (Pod bad): spec.containers[0].image: is required (line 18)",
		"mixed.yaml: document 3: apps/v1 Deployment is not supported here",
		"mixed.yaml: document 4 (Service): spec.ports[0].protocl: unknown field (line 27)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors\n%s\nlack %q", got, want)
		}
	}
}

func TestParseService(t *testing.T) {
	_, svcs, errs := Parse("svc.yml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n"), "n")
	if len(errs) > 0 || len(svcs) != 1 {
		t.Fatalf("svcs=%d errs=%v", len(svcs), errs)
	}
	s := svcs[0]
	if s.Namespace != "default" || s.Spec.Ports[0].Protocol != corev1.ProtocolTCP || s.Spec.Ports[0].TargetPort.IntValue() != 8080 || s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Fatalf("service = %+v", s.Spec)
	}
}

func TestReadIgnoresNonManifestFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"web.yaml":      webPod,
		"web.yaml.bak":  "garbage: [",
		".web.yaml.swp": "garbage: [",
		"README":        "hello",
		"broken.yml":    "kind: Pod\nmetadata: [",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := Read(dir, "n")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Pods) != 1 || len(m.Errors) != 1 || m.Errors[0].File != "broken.yml" {
		t.Fatalf("pods=%d errors=%v", len(m.Pods), m.Errors)
	}
	if _, err := Read(filepath.Join(dir, "missing"), "n"); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
}

func TestImagePullPolicyDefault(t *testing.T) {
	for image, want := range map[string]corev1.PullPolicy{
		"busybox": corev1.PullAlways, "busybox:latest": corev1.PullAlways, "busybox:1.36": corev1.PullIfNotPresent,
		"localhost:5000/busybox": corev1.PullAlways, "b@sha256:abc": corev1.PullIfNotPresent,
	} {
		c := corev1.Container{Image: image}
		defaultContainer(&c)
		if c.ImagePullPolicy != want {
			t.Errorf("%s: %s, want %s", image, c.ImagePullPolicy, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(webPod))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 1}]}\n---\nkind: Pod\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pods, svcs, _ := Parse("f.yaml", data, "node")
		for _, p := range pods {
			if p.Name == "" || p.UID == "" || p.Spec.NodeName != "node" || len(p.Spec.Containers) == 0 {
				t.Fatalf("accepted an incomplete pod: %+v", p)
			}
		}
		for _, s := range svcs {
			if s.Name == "" || s.Namespace == "" {
				t.Fatalf("accepted an unnamed service: %+v", s)
			}
		}
	})
}
