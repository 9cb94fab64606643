package yamlcheck

import (
	"encoding/json"
	"testing"

	yaml11 "go.yaml.in/yaml/v2"
	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// FuzzAgainstSigsYAML decodes one document as a Pod both with yamlcheck
// and with sigs.k8s.io/yaml's strict decode (what kubectl and the API
// machinery use): whatever yamlcheck accepts, the strict decode accepts
// too, into the same Pod. The other way round yamlcheck is stricter on
// purpose: a number or a boolean where a string goes must be quoted
// (sigs.k8s.io/yaml turns `name: 42` into "42"), and YAML 1.1's
// `yes`/`no`/`on`/`off` booleans and 0777 octals, which sigs.k8s.io/yaml
// still reads, are strings or decimals in YAML 1.2. So a document
// yamlcheck refuses may be one the strict decode takes, never the reverse.
func FuzzAgainstSigsYAML(f *testing.F) {
	for _, s := range []string{
		"apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\nspec:\n  containers:\n  - name: web\n    image: busybox\n    command: [sh, -c, 'sleep 1']\n    ports: [{containerPort: 80}]\n",
		"metadata: {name: a}\nmetadata: {name: b}\n",
		"spec: {terminationGracePeriodSeconds: 30, restartPolicy: Never}\n",
		"spec:\n  containers:\n  - name: c\n    resources: {limits: {memory: 64Mi, cpu: '0.5'}}\n",
		"metadata:\n  annotations:\n    a: &x hello\n    b: *x\n",
		"spec: {hostNetwork: true, dnsPolicy: Default, nodeSelector: {k: v}}\n",
		"spec: {containers: [{name: c, env: [{name: A, value: '1'}]}]}\n",
		"spec: {securityContext: {runAsUser: 1000, fsGroup: 2000}}\n",
		"metadata: {name: web}\nstatus: {}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := Documents(data)
		if err != nil || len(docs) != 1 {
			return
		}
		var ours corev1.Pod
		if Decode(docs[0], &ours) != nil {
			return
		}
		var theirs corev1.Pod
		if err := sigsyaml.UnmarshalStrict(data, &theirs); err != nil {
			t.Fatalf("yamlcheck accepts what sigs.k8s.io/yaml refuses (%v):\n%s", err, data)
		}
		a, _ := json.Marshal(&ours)
		b, _ := json.Marshal(&theirs)
		if string(a) != string(b) {
			t.Fatalf("decoded differently:\n%s\nyamlcheck:         %s\nsigs.k8s.io/yaml:  %s", data, a, b)
		}
	})
}

// FuzzPlainWord: a scalar plainWord passes without decoding it both ways
// is the same string to YAML 1.1 (yaml.v2, as sigs.k8s.io/yaml reads it)
// and to YAML 1.2 (yaml.v3).
func FuzzPlainWord(f *testing.F) {
	for _, s := range []string{"name", "web", "y", "Yes", "off", "NULL", "busybox", "docker.io/library/busybox", "a.b", "a_b-c", "Always", "IfNotPresent", "TCP", "x", "nan", "inf", "Infinity", "NaN", "e", "E"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !plainWord(s) {
			return
		}
		doc := []byte("v: " + s + "\n")
		var v2, v3 map[string]any
		if err := yaml11.Unmarshal(doc, &v2); err != nil {
			t.Fatalf("%q: plain word, and YAML 1.1 refuses it: %v", s, err)
		}
		if err := yaml.Unmarshal(doc, &v3); err != nil {
			t.Fatalf("%q: plain word, and YAML 1.2 refuses it: %v", s, err)
		}
		if v2["v"] != s || v3["v"] != s {
			t.Fatalf("%q: plain word, and YAML 1.1 reads %#v, YAML 1.2 %#v", s, v2["v"], v3["v"])
		}
	})
}
