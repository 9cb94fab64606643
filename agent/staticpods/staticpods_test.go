package staticpods

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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
	m := Parse("web.yaml", []byte(webPod), "pi-17")
	if len(m.Errors) > 0 || len(m.Pods) != 1 || len(m.Services) != 0 {
		t.Fatalf("pods=%d svcs=%d errs=%v", len(m.Pods), len(m.Services), m.Errors)
	}
	p := m.Pods[0]
	if p.Name != "web-pi-17" || p.Namespace != "default" || p.Spec.NodeName != "pi-17" {
		t.Fatalf("name/ns/node = %s/%s/%s", p.Namespace, p.Name, p.Spec.NodeName)
	}
	if p.Annotations[AnnotationSource] != "file" || p.Annotations[AnnotationFile] != "web.yaml" || p.Annotations[AnnotationHash] != string(p.UID) {
		t.Fatalf("annotations = %v, uid %s", p.Annotations, p.UID)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyAlways || *p.Spec.TerminationGracePeriodSeconds != 30 || p.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
		t.Fatalf("defaults not applied: %+v", p.Spec)
	}
	again := Parse("web.yaml", []byte(webPod), "pi-17").Pods
	if again[0].UID != p.UID {
		t.Fatal("UID not stable across reads")
	}
	changed := Parse("web.yaml", []byte(strings.Replace(webPod, "8080", "8081", 1)), "pi-17").Pods
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
	m := Parse("mixed.yaml", []byte(src), "n")
	if len(m.Pods) != 2 || len(m.Services) != 0 || len(m.Invalid) != 1 || len(m.Errors) != 2 {
		t.Fatalf("pods=%d svcs=%d invalid=%v errors=%v", len(m.Pods), len(m.Services), m.Invalid, m.Errors)
	}
	if _, bad := Invalid(m.Pods[0]); bad || m.Pods[0].Name != "web-n" {
		t.Fatalf("good pod not kept as it is: %+v", m.Pods[0].ObjectMeta)
	}
	if msg, bad := Invalid(m.Pods[1]); !bad || m.Pods[1].Name != "bad-n" || m.Invalid[0].Pod != m.Pods[1] || msg != "spec.containers[0].image: is required (line 18)" {
		t.Fatalf("bad pod not recorded as invalid: %q %+v", msg, m.Pods[1].ObjectMeta)
	}
	var all []string
	for _, e := range append(m.Invalid, m.Errors...) {
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
	m := Parse("svc.yml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n"), "n")
	if len(m.Errors) > 0 || len(m.Services) != 1 {
		t.Fatalf("svcs=%d errs=%v", len(m.Services), m.Errors)
	}
	s := m.Services[0]
	if s.Namespace != "default" || s.Spec.Ports[0].Protocol != corev1.ProtocolTCP || s.Spec.Ports[0].TargetPort.IntValue() != 8080 || s.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Fatalf("service = %+v", s.Spec)
	}
}

// In standalone mode no API server allocates cluster IPs or node ports,
// so a Service manifest states them.
func TestParseServiceStatesWhatTheAPIServerWouldAllocate(t *testing.T) {
	for _, tt := range []struct{ name, spec string }{
		{"cluster IP", "clusterIP: 10.96.0.10\n  ports: [{port: 80}]"},
		{"cluster IPs, both families", "clusterIPs: [\"fd00::10\", 10.96.0.10]\n  ports: [{port: 80}]"},
		{"both fields, agreeing", "clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10]\n  ports: [{port: 80}]"},
		{"headless, no ports", "clusterIP: None"},
		{"headless in clusterIPs", "clusterIPs: [None]\n  ports: [{port: 80}]"},
		{"node port", "type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{port: 80, nodePort: 30080}]"},
		{"load balancer, any node port", "type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalIPs: [192.0.2.1]\n  ports: [{name: a, port: 80, nodePort: 8080}, {name: b, port: 81, nodePort: 65535}]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := Parse("svc.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  "+tt.spec+"\n"), "n")
			if len(m.Errors) > 0 || len(m.Services) != 1 {
				t.Fatalf("svcs=%d errs=%v", len(m.Services), m.Errors)
			}
		})
	}
}

func TestParseServiceErrors(t *testing.T) {
	tests := []struct {
		name, spec string
		want       []string // each error, in order
	}{
		{"no cluster IP", "selector: {app: web}\n  ports: [{port: 80}]",
			[]string{`svc.yaml: document 1 (Service web): spec.clusterIP: is required (or "None" for a headless service): no API server allocates one (line 4)`}},
		{"bad cluster IP", "clusterIP: 10.96.0.300\n  ports: [{port: 80}]",
			[]string{`spec.clusterIP: "10.96.0.300" is not an IP address (line 5)`}},
		{"bad cluster IPs", "clusterIPs: [10.96.0.10, 10.96.0.11, \"fe80::1%eth0\"]\n  ports: [{port: 80}]", []string{
			`spec.clusterIPs: has 3 addresses; at most 2, one of each family (line 5)`,
			`spec.clusterIPs[1]: "10.96.0.11" is of the same family as spec.clusterIPs[0] (line 5)`,
			`spec.clusterIPs[2]: "fe80::1%eth0" is not an IP address (line 5)`,
		}},
		{"fields disagree", "clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.11]\n  ports: [{port: 80}]",
			[]string{`spec.clusterIPs[0]: "10.96.0.11" is not spec.clusterIP "10.96.0.10" (line 6)`}},
		{"None not first", "clusterIPs: [10.96.0.10, None]\n  ports: [{port: 80}]",
			[]string{`spec.clusterIPs[1]: "None" may only be the first and only address (line 5)`}},
		{"headless node port", "type: NodePort\n  clusterIP: None\n  ports: [{port: 80, nodePort: 30080}]",
			[]string{`spec.clusterIP: "None" may not be used when spec.type is NodePort (line 6)`}},
		{"bad external IP", "clusterIP: 10.96.0.10\n  externalIPs: [192.0.2.1, example.com]\n  ports: [{port: 80}]",
			[]string{`spec.externalIPs[1]: "example.com" is not an IP address (line 6)`}},
		{"node port missing", "type: NodePort\n  clusterIP: 10.96.0.10\n  ports:\n  - {name: a, port: 80, nodePort: 30080}\n  - {name: b, port: 81}",
			[]string{`spec.ports[1].nodePort: is required when spec.type is NodePort (no API server allocates one; 30000-32767 is the usual range) (line 9)`}},
		{"load balancer node port missing", "type: LoadBalancer\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]",
			[]string{`spec.ports[0].nodePort: is required when spec.type is LoadBalancer`}},
		{"node port on a ClusterIP service", "clusterIP: 10.96.0.10\n  ports: [{port: 80, nodePort: 30080}]",
			[]string{`spec.ports[0].nodePort: may not be set when spec.type is ClusterIP (line 6)`}},
		{"node port out of range", "type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{port: 80, nodePort: 65536}]",
			[]string{`spec.ports[0].nodePort: 65536 is not from 0 to 65535 (line 7)`}},
		{"port name twice", "clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}, {name: http, port: 81}]",
			[]string{`spec.ports[1].name: "http" is used by another port (line 6)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Parse("svc.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  "+tt.spec+"\n"), "n")
			if len(m.Errors) != 1 || len(m.Services) != 0 {
				t.Fatalf("services=%d errors=%v", len(m.Services), m.Errors)
			}
			got := m.Errors[0].Error()
			rest := got
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error\n%s\nlacks, in order, %q", got, w)
				}
				rest = rest[i+len(w):]
			}
		})
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
	f.Add([]byte(badPods))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: q, annotations: {outpost-edge.io/invalid: x}}\nspec: {containers: [{name: c, image: i, resources: {limits: {memory: 12Q}}}]}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: Q_Q}\nspec: {containers: [{name: c, ports: [{name: http, containerPort: 80}], readinessProbe: {tcpSocket: {port: htp}}}]}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 1}]}\n---\nkind: Pod\n"))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {type: NodePort, clusterIPs: [10.96.0.1, \"fd00::1\"], ports: [{port: 1, nodePort: 30001}]}\n"))
	f.Add([]byte(goodConfigMap))
	f.Add([]byte(goodSecret))
	f.Add([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v, \"b/c\": x}\nbinaryData: {k: eA==}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Secret\nmetadata: {name: a}\ndata: {k: \"not base64\", k: eA==}\nstringData: {\"\": x}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := Parse("f.yaml", data, "node")
		invalid := 0
		for _, p := range m.Pods {
			if p.Name == "" || p.Namespace == "" || p.Annotations[AnnotationSource] != "file" || p.Annotations[AnnotationFile] != "f.yaml" ||
				p.UID == "" || p.Spec.NodeName != "node" || p.Annotations[AnnotationHash] != string(p.UID) {
				t.Fatalf("accepted an incomplete pod: %+v", p)
			}
			if msg, bad := Invalid(p); bad {
				// Invalid pods are listed with their error, and say why.
				if invalid >= len(m.Invalid) || m.Invalid[invalid].Pod != p || msg == "" || strings.Contains(msg, "\n") {
					t.Fatalf("invalid pod %d not listed, or without a one-line reason %q: %v", invalid, msg, m.Invalid)
				}
				invalid++
			} else if errs := validatePodSpec(&p.Spec); len(p.Spec.Containers) == 0 || len(errs) > 0 {
				t.Fatalf("accepted a bad pod as valid: %v: %+v", errs, p)
			}
			if _, err := p.Marshal(); err != nil {
				t.Fatalf("pod does not encode: %v", err)
			}
		}
		if invalid != len(m.Invalid) {
			t.Fatalf("%d invalid pods, %d listed", invalid, len(m.Invalid))
		}
		for _, s := range m.Services {
			if s.Name == "" || s.Namespace == "" {
				t.Fatalf("accepted an unnamed service: %+v", s)
			}
			if s.Spec.ClusterIP == "" && len(s.Spec.ClusterIPs) == 0 {
				t.Fatalf("accepted a service without a cluster IP: %+v", s.Spec)
			}
			if err := validateService(s); err != nil {
				t.Fatalf("accepted service is not valid once defaulted: %v: %+v", err, s.Spec)
			}
		}
		for _, c := range m.ConfigMaps {
			checkFuzzedMeta(t, "config map", c.ObjectMeta)
			for k := range c.Data {
				if _, ok := c.BinaryData[k]; ok || len(validation.IsConfigMapKey(k)) > 0 {
					t.Fatalf("accepted config map key %q: %+v", k, c)
				}
			}
			for k := range c.BinaryData {
				if len(validation.IsConfigMapKey(k)) > 0 {
					t.Fatalf("accepted config map key %q: %+v", k, c)
				}
			}
			if _, err := c.Marshal(); err != nil {
				t.Fatalf("config map does not encode: %v", err)
			}
		}
		for _, s := range m.Secrets {
			checkFuzzedMeta(t, "secret", s.ObjectMeta)
			if s.StringData != nil || s.Type == "" {
				t.Fatalf("secret not normalized: %+v", s)
			}
			for k := range s.Data {
				if len(validation.IsConfigMapKey(k)) > 0 {
					t.Fatalf("accepted secret key %q", k)
				}
			}
			if _, err := s.Marshal(); err != nil {
				t.Fatalf("secret does not encode: %v", err)
			}
		}
	})
}

func checkFuzzedMeta(t *testing.T, what string, m metav1.ObjectMeta) {
	t.Helper()
	if len(validation.IsDNS1123Subdomain(m.Name)) > 0 || m.Namespace == "" ||
		m.Annotations[AnnotationSource] != "file" || m.Annotations[AnnotationFile] != "f.yaml" {
		t.Fatalf("accepted a bad %s: %+v", what, m)
	}
}

const goodConfigMap = `apiVersion: v1
kind: ConfigMap
metadata:
  name: web.config
  labels: {app: web}
data:
  index.html: <h1>hi</h1>
  APP_MODE: edge
binaryData:
  logo.png: iVBORw0K
`

const goodSecret = `apiVersion: v1
kind: Secret
metadata:
  name: web-creds
  namespace: edge
data:
  user: YWRtaW4=
  password: b2xk
stringData:
  password: new
  token: t0k
`

func TestParseConfigMapsAndSecrets(t *testing.T) {
	tests := []struct {
		name, src string
		check     func(t *testing.T, m Manifests)
	}{
		{"config map keeps its name and gets the annotations", goodConfigMap, func(t *testing.T, m Manifests) {
			c := m.ConfigMaps[0]
			if c.Name != "web.config" || c.Namespace != "default" || c.Labels["app"] != "web" {
				t.Fatalf("meta = %+v", c.ObjectMeta)
			}
			if c.Annotations[AnnotationSource] != "file" || c.Annotations[AnnotationFile] != "cfg.yaml" || c.Annotations[AnnotationHash] != "" {
				t.Fatalf("annotations = %v", c.Annotations)
			}
			if c.Data["index.html"] != "<h1>hi</h1>" || c.Data["APP_MODE"] != "edge" || string(c.BinaryData["logo.png"]) != "\x89PNG\r\n" {
				t.Fatalf("data = %q binaryData = %q", c.Data, c.BinaryData)
			}
		}},
		{"secret merges stringData into data, stringData winning", goodSecret, func(t *testing.T, m Manifests) {
			s := m.Secrets[0]
			if s.Name != "web-creds" || s.Namespace != "edge" || s.Annotations[AnnotationFile] != "cfg.yaml" || s.Annotations[AnnotationSource] != "file" {
				t.Fatalf("meta = %+v", s.ObjectMeta)
			}
			want := map[string]string{"user": "admin", "password": "new", "token": "t0k"}
			if len(s.Data) != len(want) || s.StringData != nil {
				t.Fatalf("data = %q, stringData = %q", s.Data, s.StringData)
			}
			for k, v := range want {
				if string(s.Data[k]) != v {
					t.Errorf("data[%s] = %q, want %q", k, s.Data[k], v)
				}
			}
			if s.Type != corev1.SecretTypeOpaque {
				t.Fatalf("type = %q", s.Type)
			}
		}},
		{"secret with only stringData and a type", "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ntype: kubernetes.io/basic-auth\nstringData: {username: u}\n", func(t *testing.T, m Manifests) {
			s := m.Secrets[0]
			if string(s.Data["username"]) != "u" || s.Type != corev1.SecretTypeBasicAuth || s.Namespace != "default" {
				t.Fatalf("secret = %+v", s)
			}
		}},
		{"empty config map", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: empty}\n", func(t *testing.T, m Manifests) {
			if len(m.ConfigMaps[0].Data) != 0 {
				t.Fatalf("config map = %+v", m.ConfigMaps[0])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Parse("cfg.yaml", []byte(tt.src), "pi-17")
			if len(m.Errors) > 0 || len(m.ConfigMaps)+len(m.Secrets) != 1 || len(m.Pods)+len(m.Services) != 0 {
				t.Fatalf("configMaps=%d secrets=%d errs=%v", len(m.ConfigMaps), len(m.Secrets), m.Errors)
			}
			tt.check(t, m)
		})
	}
}

func TestParseConfigMapAndSecretErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string // each error, in order
	}{
		{"bad config map key", `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  good: x
  bad/key: v
`, []string{`bad.yaml: document 1 (ConfigMap cfg): data["bad/key"]: is invalid: a valid config key must consist of alphanumeric characters, '-', '_' or '.'`, "(line 6)"}},
		{"key in data and binaryData", `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  logo: x
binaryData:
  other: eA==
  logo: eA==
`, []string{`bad.yaml: document 1 (ConfigMap cfg): binaryData["logo"]: is also in data (line 8)`}},
		{"key twice in data", `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data:
  a: x
  a: y
`, []string{"bad.yaml: document 1 (ConfigMap): data.a: duplicate key (first at line 5) (line 6)"}},
		{"bad names", `apiVersion: v1
kind: ConfigMap
metadata:
  name: Web_Config
  namespace: a.b
`, []string{`bad.yaml: document 1 (ConfigMap Web_Config): metadata.name: "Web_Config" is invalid: a lowercase RFC 1123 subdomain`, "(line 4)", `metadata.namespace: "a.b" is invalid`, "(line 5)"}},
		{"missing name", "apiVersion: v1\nkind: Secret\nmetadata: {}\n", []string{"bad.yaml: document 1 (Secret ): metadata.name: is required (line 3)"}},
		{"bad secret keys, sorted, with lines", `apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData:
  "..": x
  ok: v
data:
  "z z": eA==
  "a a": eA==
`, []string{
			`bad.yaml: document 1 (Secret creds): data["a a"]: is invalid: a valid config key`, "(line 9)\n",
			`data["z z"]: is invalid: a valid config key`, "(line 8)\n",
			`stringData[".."]: is invalid: must not be '..' (line 5)`,
		}},
		{"secret data not base64, value not repeated", `apiVersion: v1
kind: Secret
metadata: {name: creds}
data:
  password: hunter2
`, []string{"bad.yaml: document 1 (Secret): data.password: want base64 text: illegal base64 data at input byte 4 (line 5)"}},
		{"unknown secret field", "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringdata: {a: b}\n", []string{"bad.yaml: document 1 (Secret): stringdata: unknown field (line 4)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Parse("bad.yaml", []byte(tt.src), "n")
			if len(m.Errors) != 1 || len(m.ConfigMaps)+len(m.Secrets) != 0 {
				t.Fatalf("configMaps=%d secrets=%d errors=%v", len(m.ConfigMaps), len(m.Secrets), m.Errors)
			}
			got := m.Errors[0].Error()
			if strings.Contains(got, "hunter2") {
				t.Fatalf("error repeats a secret value: %s", got)
			}
			rest := got
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error\n%s\nlacks, in order, %q", got, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestParseKeepsGoodDocumentsBesideABadConfigMap(t *testing.T) {
	src := goodConfigMap + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\ndata: {\"a b\": x}\n---\n" + goodSecret + "---\n" + webPod
	m := Parse("all.yaml", []byte(src), "n")
	if len(m.ConfigMaps) != 1 || len(m.Secrets) != 1 || len(m.Pods) != 1 || len(m.Errors) != 1 {
		t.Fatalf("configMaps=%d secrets=%d pods=%d errors=%v", len(m.ConfigMaps), len(m.Secrets), len(m.Pods), m.Errors)
	}
	if want := `all.yaml: document 2 (ConfigMap bad): data["a b"]: is invalid`; !strings.HasPrefix(m.Errors[0].Error(), want) {
		t.Fatalf("error %q, want prefix %q", m.Errors[0], want)
	}
}

// badPods is a file of pods with good metadata and bad specs, beside a
// good one.
const badPods = webPod + `---
apiVersion: v1
kind: Pod
metadata: {name: noimage, labels: {app: x}}
spec:
  containers:
  - name: c
---
apiVersion: v1
kind: Pod
metadata: {name: quantity}
spec:
  containers:
  - name: c
    image: busybox:1
    resources:
      limits: {memory: 12Q}
`

func TestParseRecordsPodWithBadSpecAsInvalid(t *testing.T) {
	tests := []struct {
		name string
		spec string // below spec:, indented by two spaces
		want string // the pod's invalid annotation
	}{
		{"no image", `
  containers:
  - name: c
    image: " "`, "spec.containers[0].image: is required (line 8)"},
		{"unknown volume in a volume mount", `
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: c
    image: busybox:1
    volumeMounts:
    - {name: data, mountPath: /data}
    - {name: cache, mountPath: /cache}`, `spec.containers[0].volumeMounts[1].name: "cache" is not a volume of the pod (spec.volumes) (line 12)`},
		{"port name too long", `
  containers:
  - name: c
    image: busybox:1
    ports:
    - name: metrics-endpoint-1
      containerPort: 9090`, `spec.containers[0].ports[0].name: "metrics-endpoint-1" is not a valid port name: must be no more than 15 characters (line 10)`},
		{"port name with bad characters", `
  containers:
  - name: c
    image: busybox:1
    ports:
    - {name: HTTP_PORT, containerPort: 80}`, `spec.containers[0].ports[0].name: "HTTP_PORT" is not a valid port name: must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-) (line 10)`},
		{"probe on a port the container does not have", `
  containers:
  - name: c
    image: busybox:1
    ports: [{name: http, containerPort: 80}]
    readinessProbe:
      httpGet: {path: /, port: htttp}
    livenessProbe:
      tcpSocket: {port: http}`, `spec.containers[0].readinessProbe.httpGet.port: "htttp" is not the name of a port of this container (line 11)`},
		{"hook on a port the container does not have", `
  containers:
  - name: c
    image: busybox:1
    lifecycle:
      preStop:
        httpGet: {path: /quit, port: admin}`, `spec.containers[0].lifecycle.preStop.httpGet.port: "admin" is not the name of a port of this container (line 11)`},
		{"quantity that does not parse", `
  containers:
  - name: c
    image: busybox:1
    resources:
      limits: {memory: 12Q}`, `spec.containers[0].resources.limits.memory: invalid value "12Q": quantities must match the regular expression`},
		{"request above its limit", `
  containers:
  - name: c
    image: busybox:1
    resources:
      requests: {memory: 2Gi}
      limits: {memory: 1Gi}`, `spec.containers[0].resources.requests.memory: 2Gi is more than the limit 1Gi (line 10)`},
		{"negative quantity", `
  containers:
  - name: c
    image: busybox:1
    resources:
      limits: {cpu: "-1"}`, `spec.containers[0].resources.limits.cpu: -1 must not be negative (line 10)`},
		{"duplicate container names", `
  initContainers:
  - {name: c, image: busybox:1}
  containers:
  - {name: c, image: busybox:1}`, `spec.containers[0].name: "c" is used by another container (line 9)`},
		{"unknown field", `
  containers:
  - name: c
    imag: busybox:1`, "spec.containers[0].imag: unknown field (line 8)"},
		{"every error, in the order of the spec", `
  containers:
  - name: c
    volumeMounts: [{name: data, mountPath: /d}]
  - name: c
    image: busybox:1`, `spec.containers[0].image: is required (line 7); ` +
			`spec.containers[0].volumeMounts[0].name: "data" is not a volume of the pod (spec.volumes) (line 8); ` +
			`spec.containers[1].name: "c" is used by another container (line 9)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:" + tt.spec + "\n"
			m := Parse("bad.yaml", []byte(src+"---\n"+webPod), "n")
			if len(m.Errors) != 0 || len(m.Pods) != 2 || len(m.Invalid) != 1 {
				t.Fatalf("pods=%d invalid=%v errors=%v", len(m.Pods), m.Invalid, m.Errors)
			}
			if _, bad := Invalid(m.Pods[1]); bad {
				t.Fatalf("the good pod is marked invalid: %v", m.Pods[1].Annotations)
			}
			p := m.Pods[0]
			msg, bad := Invalid(p)
			if !bad || !strings.HasPrefix(msg, tt.want) || strings.Contains(msg, "\n") {
				t.Fatalf("invalid = %v, reason\n%q\nwant it to start with\n%q", bad, msg, tt.want)
			}
			if p.Name != "bad-n" || p.Namespace != "default" || p.UID == "" || p.Annotations[AnnotationFile] != "bad.yaml" || p.Spec.NodeName != "n" {
				t.Fatalf("invalid pod not named and annotated as a static pod: %+v", p.ObjectMeta)
			}
			fe := m.Invalid[0]
			if fe.Pod != p || !strings.HasPrefix(fe.Error(), "bad.yaml: document 1 (Pod bad): "+strings.SplitN(tt.want, ";", 2)[0]) {
				t.Fatalf("error %q, pod %p (want %p)", fe, fe.Pod, p)
			}
			if _, err := p.Marshal(); err != nil {
				t.Fatalf("invalid pod does not encode: %v", err)
			}
		})
	}
}

func TestParseInvalidPod(t *testing.T) {
	m := Parse("bad.yaml", []byte(badPods), "n")
	if len(m.Pods) != 3 || len(m.Invalid) != 2 || len(m.Errors) != 0 {
		t.Fatalf("pods=%d invalid=%v errors=%v", len(m.Pods), m.Invalid, m.Errors)
	}
	t.Run("keeps the metadata of a spec that decodes, and the spec", func(t *testing.T) {
		p := m.Pods[1]
		if p.Name != "noimage-n" || p.Labels["app"] != "x" || len(p.Spec.Containers) != 1 {
			t.Fatalf("pod = %+v", p)
		}
	})
	t.Run("keeps the metadata of a spec that does not decode, not the spec", func(t *testing.T) {
		p := m.Pods[2]
		if p.Name != "quantity-n" || len(p.Spec.Containers) != 0 || p.Spec.NodeName != "n" {
			t.Fatalf("pod = %+v", p)
		}
	})
	t.Run("a fixed manifest gives a valid pod with a new UID", func(t *testing.T) {
		fixed := Parse("bad.yaml", []byte(strings.Replace(badPods, "12Q", "12Mi", 1)), "n")
		if len(fixed.Pods) != 3 || len(fixed.Invalid) != 1 {
			t.Fatalf("pods=%d invalid=%v", len(fixed.Pods), fixed.Invalid)
		}
		if _, bad := Invalid(fixed.Pods[2]); bad || fixed.Pods[2].UID == m.Pods[2].UID {
			t.Fatalf("fixed pod: invalid=%v uid %s, was %s", bad, fixed.Pods[2].UID, m.Pods[2].UID)
		}
	})
	t.Run("a manifest cannot mark its pod invalid", func(t *testing.T) {
		src := strings.Replace(webPod, "labels: {app: web}", "annotations: {outpost-edge.io/invalid: 'no'}", 1)
		got := Parse("web.yaml", []byte(src), "n")
		if len(got.Pods) != 1 || len(got.Invalid) != 0 {
			t.Fatalf("pods=%d invalid=%v errors=%v", len(got.Pods), got.Invalid, got.Errors)
		}
		if _, bad := Invalid(got.Pods[0]); bad {
			t.Fatalf("annotations = %v", got.Pods[0].Annotations)
		}
	})
	t.Run("a pod from another source is never invalid", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationInvalid: "x"}}}
		if _, bad := Invalid(p); bad {
			t.Fatal("a pod without the static source annotation counts as invalid")
		}
	})
}

func TestParsePodWithBadMetadataYieldsOnlyAnError(t *testing.T) {
	tests := []struct {
		name, src string
		want      string
	}{
		{"no name, bad spec", "apiVersion: v1\nkind: Pod\nmetadata: {labels: {a: b}}\nspec: {containers: [{name: c}]}\n",
			"bad.yaml: document 1 (Pod): metadata.name: is required (line 3)\nspec.containers[0].image: is required (line 4)"},
		{"no name, spec that does not decode", "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c, image: i, resources: {limits: {cpu: x}}}]}\n",
			"bad.yaml: document 1 (Pod): metadata.name: is required (line 3)\nspec.containers[0].resources.limits.cpu: invalid value \"x\""},
		{"metadata that does not decode", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: [x]}\nspec: {containers: [{name: c, image: i}]}\n",
			"bad.yaml: document 1 (Pod): metadata.labels: want a mapping, got a list (line 3)"},
		{"no metadata", "apiVersion: v1\nkind: Pod\nspec: {containers: [{name: c, image: i, resources: {limits: {cpu: x}}}]}\n",
			"bad.yaml: document 1 (Pod): spec.containers[0].resources.limits.cpu: invalid value \"x\""},
		{"bad name", "apiVersion: v1\nkind: Pod\nmetadata: {name: Web_1, namespace: a.b}\nspec: {containers: [{name: c}]}\n",
			"bad.yaml: document 1 (Pod Web_1): metadata.name: \"Web_1\" is invalid: a lowercase RFC 1123 subdomain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Parse("bad.yaml", []byte(tt.src), "n")
			if len(m.Pods) != 0 || len(m.Invalid) != 0 || len(m.Errors) != 1 {
				t.Fatalf("pods=%d invalid=%v errors=%v", len(m.Pods), m.Invalid, m.Errors)
			}
			if got := m.Errors[0].Error(); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("error\n%s\nwant it to start with\n%s", got, tt.want)
			}
		})
	}
}

func TestReaderParsesOnlyChangedFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("web.yaml", webPod)
	write("cm.yaml", goodConfigMap)
	var r Reader
	first, err := r.Read(dir, "pi")
	if err != nil || len(first.Pods) != 1 || len(first.ConfigMaps) != 1 {
		t.Fatalf("first read: %d pods, %d config maps, err %v", len(first.Pods), len(first.ConfigMaps), err)
	}
	cached := r.files["web.yaml"].m.Pods[0]
	// What a read returns is the caller's: changing it changes no later read.
	first.Pods[0].Spec.Containers[0].Image = "changed"
	second, _ := r.Read(dir, "pi")
	if r.files["web.yaml"].m.Pods[0] != cached {
		t.Fatal("an unchanged file was decoded again")
	}
	if got := second.Pods[0].Spec.Containers[0].Image; got == "changed" {
		t.Fatal("a read shares its objects with an earlier read")
	}
	if !reflect.DeepEqual(second.Pods[0], r.files["web.yaml"].m.Pods[0]) {
		t.Fatal("a cached read differs from the parse")
	}
	// New content is decoded; a removed file is forgotten.
	write("web.yaml", strings.Replace(webPod, "name: web", "name: web2", 1))
	os.Remove(filepath.Join(dir, "cm.yaml"))
	third, _ := r.Read(dir, "pi")
	if len(third.Pods) != 1 || third.Pods[0].Name != "web2-pi" || len(third.ConfigMaps) != 0 {
		t.Fatalf("after the edit: pods %v, %d config maps", third.Pods, len(third.ConfigMaps))
	}
	if _, ok := r.files["cm.yaml"]; ok {
		t.Fatal("a removed file is still cached")
	}
}

func TestDefaultPullPolicyLikeTheAPI(t *testing.T) {
	for image, want := range map[string]corev1.PullPolicy{
		"busybox":                        corev1.PullAlways,
		"busybox:latest":                 corev1.PullAlways,
		"busybox:1.35":                   corev1.PullIfNotPresent,
		"localhost:5000/busybox":         corev1.PullAlways,
		"localhost:5000/busybox:1":       corev1.PullIfNotPresent,
		"busybox@sha256:0123":            corev1.PullIfNotPresent,
		"busybox:latest@sha256:0123":     corev1.PullAlways,
		"localhost:5000/b:1@sha256:0123": corev1.PullIfNotPresent,
	} {
		if got := DefaultPullPolicy(image); got != want {
			t.Errorf("DefaultPullPolicy(%q) = %s, want %s", image, got, want)
		}
	}
}
