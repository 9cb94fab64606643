package yamlcheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func decodePod(t *testing.T, src string) (*corev1.Pod, error) {
	t.Helper()
	docs, err := Documents([]byte(src))
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		t.Fatalf("got %d documents", len(docs))
	}
	var p corev1.Pod
	return &p, Decode(docs[0], &p)
}

func TestDecodeErrorsNamePathAndLine(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"unknown nested field", `
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: web
    imgae: busybox
`, []string{"spec.containers[0].imgae: unknown field (line 8)"}},
		{"wrong type", `
kind: Pod
spec:
  containers:
  - name: 42
`, []string{"spec.containers[0].name: want a string, got number 42 (quote it) (line 5)"}},
		{"bad quantity", `
spec:
  containers:
  - name: c
    resources: {limits: {memory: lots}}
`, []string{"spec.containers[0].resources.limits.memory: invalid value \"lots\"", "(line 5)"}},
		{"several at once", `
metadata: {name: web, labelz: {}}
spec: {restartPolicy: [Always], terminationGracePeriodSeconds: soon}
`, []string{"metadata.labelz: unknown field", "spec.restartPolicy: want a string, got a list", "spec.terminationGracePeriodSeconds: want an integer"}},
		{"duplicate", "metadata: {name: a}\nmetadata: {name: b}\n", []string{"metadata: duplicate field (line 2)"}},
		{"integer overflow", "spec: {terminationGracePeriodSeconds: 99999999999999999999}\n", []string{"want an integer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodePod(t, tt.src)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestDecodeGoodPod(t *testing.T) {
	p, err := decodePod(t, `
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: web
    image: busybox
    command: [httpd, -f]
    ports: [{containerPort: 80}]
    resources: {limits: {memory: 64Mi, cpu: 100m}}
    livenessProbe: {httpGet: {port: 80, path: /}}
`)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0]
	if p.Name != "web" || c.Image != "busybox" || c.Resources.Limits.Memory().String() != "64Mi" || c.LivenessProbe.HTTPGet.Port.IntValue() != 80 {
		t.Fatalf("decoded %+v", p)
	}
}

func TestDocumentsSkipsEmptyAndReportsSyntaxLine(t *testing.T) {
	docs, err := Documents([]byte("---\na: 1\n---\n---\nb: 2\n"))
	if err != nil || len(docs) != 2 {
		t.Fatalf("docs=%d err=%v", len(docs), err)
	}
	_, err = Documents([]byte("a: 1\nb: [unclosed\n"))
	if err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("syntax error without line: %v", err)
	}
}

func FuzzDecodePod(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a, image: b}]}\n"))
	f.Add([]byte("spec: {containers: [{resources: {limits: {cpu: x}}}]}"))
	f.Add([]byte("a: &x [*x]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := Documents(data)
		if err != nil {
			return
		}
		for _, d := range docs {
			var p corev1.Pod
			_ = Decode(d, &p)
		}
	})
}

func TestAliasBombRefused(t *testing.T) {
	src := "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
	docs, err := Documents([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string][][][][][]string
	if err := Decode(docs[0], &v); err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Fatalf("err = %v", err)
	}
}

func TestLine(t *testing.T) {
	docs, _ := Documents([]byte("metadata:\n  name: a\nspec:\n  containers:\n  - name: a\n    image: b\n  - name: c\n"))
	for path, want := range map[string]int{"metadata.name": 2, "spec.containers[0].image": 6, "spec.containers[1]": 7, "spec.containers[1].image": 7, "spec.volumes": 3} {
		if got := Line(docs[0], path); got != want {
			t.Errorf("Line(%s) = %d, want %d", path, got, want)
		}
	}
}

func TestDecodeBase64AndMapKeys(t *testing.T) {
	tests := []struct {
		name, src string
		want      string // "" for no error
		leak      string // a value the error must not repeat
	}{
		{"good base64", "data: {a: aGVsbG8=}\n", "", ""},
		{"base64 over lines", "data:\n  a: |\n    aGVs\n    bG8=\n", "", ""},
		{"bad base64", "type: Opaque\ndata:\n  password: hunter2\n", "data.password: want base64 text: illegal base64 data at input byte 4 (line 3)", "hunter2"},
		{"number", "data:\n  pin: 12345678\n", "data.pin: want base64 text, got a YAML int (quote it) (line 2)", "12345678"},
		{"binary tag", "data:\n  a: !!binary aGVsbG8=\n", "data.a: the !!binary tag is not supported; write the base64 text untagged (line 2)", ""},
		{"duplicate map key", "stringData:\n  a: x\n  b: w\n  a: z\n", "stringData.a: duplicate key (first at line 2) (line 4)", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			docs, err := Documents([]byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			var s corev1.Secret
			err = Decode(docs[0], &s)
			if tt.want == "" {
				if err != nil || string(s.Data["a"]) != "hello" {
					t.Fatalf("err=%v data=%q", err, s.Data)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if tt.leak != "" && strings.Contains(err.Error(), tt.leak) {
				t.Fatalf("error repeats the secret value: %v", err)
			}
		})
	}
}

// A plain scalar YAML 1.1 reads as something else must be quoted; the
// same quoted, or one both read alike, is taken.
func TestYAML11Ambiguous(t *testing.T) {
	for _, v := range []string{"no", "on", "Y", "off", "0777", "1_000", "0b11"} {
		src := "data:\n  k: " + v + "\n"
		docs, err := Documents([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		var cm corev1.ConfigMap
		err = Decode(docs[0], &cm)
		if err == nil || !strings.Contains(err.Error(), "data.k: ") || !strings.Contains(err.Error(), "quote it) (line 2)") && !strings.Contains(err.Error(), "quote it (line 2)") {
			t.Errorf("%s: %v (decoded %q)", v, err, cm.Data)
		}
		docs, _ = Documents([]byte("data:\n  k: '" + v + "'\n"))
		if err := Decode(docs[0], &cm); err != nil || cm.Data["k"] != v {
			t.Errorf("'%s': %v, %q", v, err, cm.Data)
		}
	}
	for _, src := range []string{"data: {k: hello}\n", "data: {k: 'true'}\n", "spec: {terminationGracePeriodSeconds: 30}\n", "metadata: {labels: {'1': x}}\n"} {
		docs, _ := Documents([]byte(src))
		var p corev1.Pod
		var cm corev1.ConfigMap
		var err error
		if strings.HasPrefix(src, "data") {
			err = Decode(docs[0], &cm)
		} else {
			err = Decode(docs[0], &p)
		}
		if err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
	docs, _ := Documents([]byte("metadata: {labels: {1: x}}\n"))
	var p corev1.Pod
	if err := Decode(docs[0], &p); err == nil || !strings.Contains(err.Error(), "want a string key, got number 1 (quote it)") {
		t.Errorf("an unquoted number key: %v", err)
	}
}
