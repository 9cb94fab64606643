package yamlcheck

import (
	"encoding/json"
	"testing"

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
