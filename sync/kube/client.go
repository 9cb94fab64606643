package kube

import (
	"errors"
	"fmt"
	"os"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	certsv1 "k8s.io/api/certificates/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// scheme registers only the API groups outpost uses.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, coordv1.AddToScheme, discoveryv1.AddToScheme, certsv1.AddToScheme,
		// TokenRequest, which Core posts to serviceaccounts/<name>/token.
		// TokenReview and SubjectAccessReview, which the kubelet API
		// posts to authenticate and authorize its clients.
		authnv1.AddToScheme, authzv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err) // a programming error: the scheme is static
		}
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
}

// Scheme returns the scheme of the groups outpost speaks, for decoding
// objects in tests and tools.
func Scheme() *runtime.Scheme { return scheme }

// Client holds one REST client per API group outpost uses, all over the
// same connection settings.
type Client struct {
	// Core is core/v1: nodes, pods, config maps, secrets, events, and
	// service account tokens (an authentication/v1 TokenRequest posted
	// to the serviceaccounts/token subresource).
	Core rest.Interface
	// Coordination is coordination/v1: the node's Lease.
	Coordination rest.Interface
	// Discovery is discovery/v1: endpoint slices.
	Discovery rest.Interface
	// Certificates is certificates/v1: certificate signing requests.
	Certificates rest.Interface
	// Authentication is authentication/v1: token reviews.
	Authentication rest.Interface
	// Authorization is authorization/v1: subject access reviews.
	Authorization rest.Interface
	// Config is the connection the clients were made from.
	Config *rest.Config
}

// protobuf is the wire format of every request; JSON stays acceptable in
// answers because errors and a few endpoints only speak JSON.
const (
	contentProtobuf = "application/vnd.kubernetes.protobuf"
	acceptTypes     = contentProtobuf + ",application/json"
)

// NewClient returns a Client for cfg. It makes no request.
func NewClient(cfg *rest.Config, userAgent string) (*Client, error) {
	c := &Client{Config: cfg}
	for _, g := range []struct {
		dst  *rest.Interface
		gv   schema.GroupVersion
		path string
	}{
		{&c.Core, corev1.SchemeGroupVersion, "/api"},
		{&c.Coordination, coordv1.SchemeGroupVersion, "/apis"},
		{&c.Discovery, discoveryv1.SchemeGroupVersion, "/apis"},
		{&c.Certificates, certsv1.SchemeGroupVersion, "/apis"},
		{&c.Authentication, authnv1.SchemeGroupVersion, "/apis"},
		{&c.Authorization, authzv1.SchemeGroupVersion, "/apis"},
	} {
		gc := rest.CopyConfig(cfg)
		gv := g.gv
		gc.GroupVersion = &gv
		gc.APIPath = g.path
		gc.ContentType = contentProtobuf
		gc.AcceptContentTypes = acceptTypes
		gc.NegotiatedSerializer = codecs.WithoutConversion()
		if gc.UserAgent == "" {
			gc.UserAgent = userAgent
		}
		// The writes a reconnect replays are paced by the syncer's own
		// limiter; client-go's default of 5 per second would only add a
		// second, hidden queue.
		if gc.QPS == 0 {
			gc.QPS, gc.Burst = 100, 200
		}
		rc, err := rest.RESTClientFor(gc)
		if err != nil {
			return nil, fmt.Errorf("api client for %s: %w", gv, err)
		}
		*g.dst = rc
	}
	return c, nil
}

// LoadKubeconfig reads a kubeconfig file and returns the connection its
// current context describes. A file that is missing, not YAML, or whose
// current context lacks a cluster, server or credentials is an error
// naming the file and what is wrong.
func LoadKubeconfig(path string) (*rest.Config, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if raw.CurrentContext == "" && len(raw.Contexts) != 1 {
		return nil, fmt.Errorf("kubeconfig %s: current-context: not set, and the file has %d contexts", path, len(raw.Contexts))
	}
	if raw.CurrentContext == "" {
		for name := range raw.Contexts {
			raw.CurrentContext = name
		}
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, raw.CurrentContext, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, errors.Join(unwrapAll(err)...))
	}
	return cfg, nil
}

// unwrapAll flattens clientcmd's aggregate of validation errors.
func unwrapAll(err error) []error {
	if agg, ok := err.(interface{ Errors() []error }); ok {
		return agg.Errors()
	}
	return []error{err}
}
