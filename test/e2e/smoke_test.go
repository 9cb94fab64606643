package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

// coreClient is a REST client for core/v1 over a scheme with only that
// group, speaking protobuf, the way outpost's sync will.
func coreClient(t testing.TB, cfg *rest.Config) *rest.RESTClient {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeProtobuf
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func TestSmokeAPIServer(t *testing.T) {
	api := env.StartAPIServer(t)
	rc := coreClient(t, api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke-node", Labels: map[string]string{"kubernetes.io/arch": "arm64"}},
	}
	var created corev1.Node
	if err := rc.Post().Resource("nodes").Body(node).Do(ctx).Into(&created); err != nil {
		t.Fatalf("create node: %v", err)
	}
	var got corev1.Node
	if err := rc.Get().Resource("nodes").Name("smoke-node").Do(ctx).Into(&got); err != nil {
		t.Fatalf("get node: %v", err)
	}
	if got.UID == "" || got.UID != created.UID || got.Labels["kubernetes.io/arch"] != "arm64" {
		t.Fatalf("node read back = %+v", got.ObjectMeta)
	}
}

func TestSmokeContainerd(t *testing.T) {
	ctrd := env.StartContainerd(t)
	t.Logf("containerd %s", ctrd.Version)
	const ns = "outpost-smoke"
	img := ctrd.ImportTestImage(t, ns)
	cl := ctrd.Client(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = namespacesCtx(ctx, ns)

	c, err := cl.NewContainer(ctx, "smoke",
		client.WithNewSnapshot("smoke-snap", img),
		// Under the containerd's cgroup parent, which its cleanup removes
		// (by default runc would leave /outpost-smoke behind).
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithCgroup(ctrd.CgroupParent+"/smoke"),
			oci.WithProcessArgs("sh", "-c", "echo hello from $(hostname -s 2>/dev/null || echo busybox); exit 3")))
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	defer c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
	var out, errOut bytes.Buffer // one copier goroutine each
	task, err := c.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, &errOut)))
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	defer task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
	exitc, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	var st client.ExitStatus
	select {
	case st = <-exitc:
	case <-ctx.Done():
		t.Fatal("container did not exit")
	}
	// Wait for the output copy to finish before reading it.
	task.IO().Wait()
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if st.ExitCode() != 3 {
		t.Fatalf("exit code %d, want 3", st.ExitCode())
	}
	if !strings.HasPrefix(out.String(), "hello from ") {
		t.Fatalf("output %q, stderr %q", out.String(), errOut.String())
	}
}

func TestSmokeMosquitto(t *testing.T) {
	broker := env.StartMosquitto(t)
	connect := func(id string) mqtt.Client {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker.URL).SetClientID(id).SetConnectTimeout(5 * time.Second))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect %s: %v", id, tok.Error())
		}
		t.Cleanup(func() { c.Disconnect(100) })
		return c
	}
	sub, pub := connect("smoke-sub"), connect("smoke-pub")
	got := make(chan string, 1)
	topic := "outpost/v1/nodes/smoke/status"
	if tok := sub.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	want := fmt.Sprintf("ready at %d", time.Now().UnixNano())
	if tok := pub.Publish(topic, 1, false, want); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case m := <-got:
		if m != want {
			t.Fatalf("received %q, want %q", m, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("message not received")
	}
}

// TestSmokeRegistry pushes the test image to a private registry (twice:
// the second push finds its blobs there) and pulls it back with
// containerd's client, over plain HTTP on the loopback.
func TestSmokeRegistry(t *testing.T) {
	reg := env.StartRegistry(t)
	ctrd := env.StartContainerd(t)
	ref := reg.PushTestImage(t, "smoke/busybox", "1.35")
	reg.PushTestImage(t, "smoke/busybox", "1.35")
	const ns = "outpost-smoke-registry"
	cl := ctrd.Client(t, ns)
	ctx, cancel := context.WithTimeout(namespacesCtx(context.Background(), ns), 60*time.Second)
	defer cancel()
	img, err := cl.Pull(ctx, ref, client.WithPullUnpack)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	spec, err := img.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name() != ref || len(spec.Config.Cmd) != 1 || spec.Config.Cmd[0] != "sh" {
		t.Fatalf("pulled %s with cmd %q, want %s with [sh]", img.Name(), spec.Config.Cmd, ref)
	}
}
