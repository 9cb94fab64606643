package staticpods

import "testing"

// rebootManifest is one pod of the reboot benchmark's (test/e2e,
// BenchmarkPeersReboot), whose 30 files the agent reads as it starts.
const rebootManifest = `apiVersion: v1
kind: Pod
metadata: {name: boot-07, namespace: default}
spec:
  terminationGracePeriodSeconds: 2
  enableServiceLinks: false
  containers:
  - name: web
    image: docker.io/library/busybox:1.36
    imagePullPolicy: Never
    command: [sh, -c, "touch /started/boot-07 && exec httpd -f -p 8080 -h /var/www"]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 10
    volumeMounts: [{name: started, mountPath: /started}]
  volumes:
  - name: started
    hostPath: {path: /tmp/started, type: Directory}
`

// BenchmarkParse decodes and checks one pod manifest.
func BenchmarkParse(b *testing.B) {
	data := []byte(rebootManifest)
	b.ReportAllocs()
	for b.Loop() {
		if m := Parse("boot-07.yaml", data, "node-a"); len(m.Pods) != 1 || len(m.Errors)+len(m.Invalid) > 0 {
			b.Fatalf("parsed %+v", m)
		}
	}
}
