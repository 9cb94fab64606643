// Package ctrd is the agent's containerd client: the gRPC services of
// containerd's API, the stores of containerd's core packages over them,
// and the container, task and process calls the agent makes.
//
// It stands in for containerd's v2 Go client (client), which links
// packages the agent never uses and whose initialisers keep memory for
// the life of the process: go-cmp through pkg/protobuf (every service
// proxy of the client imports it), distribution/reference through the
// image archive importer, and the descriptors of API services the agent
// does not call. The content, snapshot, lease, image and container stores
// here are containerd v2.2.9's own proxies (Apache-2.0, "Copyright The
// containerd Authors"), with their timestamps converted by timestamppb
// instead of pkg/protobuf; each file says where it came from.
package ctrd

import (
	"context"
	"fmt"
	"strconv"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	contentapi "github.com/containerd/containerd/api/services/content/v1"
	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	diffproxy "github.com/containerd/containerd/v2/core/diff/proxy"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/dialer"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

func init() {
	// The type URLs of the OCI spec and process, as the v2 client
	// registers them: containerd and its shims read specs by these.
	const prefix = "types.containerd.io"
	major := strconv.Itoa(specs.VersionMajor)
	typeurl.Register(&specs.Spec{}, prefix, "opencontainers/runtime-spec", major, "Spec")
	typeurl.Register(&specs.Process{}, prefix, "opencontainers/runtime-spec", major, "Process")
}

// Client is a connection to containerd and its services. The namespace
// of every call is the one its context carries (pkg/namespaces).
type Client struct {
	conn *grpc.ClientConn

	// Containers is the container store.
	Containers containers.Store
	// Content is the content store.
	Content content.Store
	// Images is the image store.
	Images images.Store
	// Leases is the lease manager.
	Leases leases.Manager
	// Diff applies layers to mounts.
	Diff diff.Applier
	// Tasks is the task service; its errors are gRPC's (see Native).
	Tasks tasksapi.TasksClient

	events    eventsapi.EventsClient
	version   versionapi.VersionClient
	snapshots snapshotsapi.SnapshotsClient
}

// New connects to containerd's socket at address. The connection is made
// lazily, by the first call, which waits up to timeout for the socket to
// appear and answer.
func New(address string, timeout time.Duration) (*Client, error) {
	bo := backoff.DefaultConfig
	bo.MaxDelay = timeout
	conn, err := grpc.NewClient(dialer.DialAddress(address),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: timeout}),
		grpc.WithContextDialer(dialer.ContextDialer),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(defaults.DefaultMaxRecvMsgSize),
			grpc.MaxCallSendMsgSize(defaults.DefaultMaxSendMsgSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	return &Client{
		conn:       conn,
		Containers: NewRemoteContainerStore(containersapi.NewContainersClient(conn)),
		Content:    NewContentStore(contentapi.NewContentClient(conn)),
		Images:     NewImageStoreFromClient(imagesapi.NewImagesClient(conn)),
		Leases:     NewLeaseManager(leasesapi.NewLeasesClient(conn)),
		Diff:       diffproxy.NewDiffApplier(diffapi.NewDiffClient(conn)).(diff.Applier),
		Tasks:      tasksapi.NewTasksClient(conn),
		events:     eventsapi.NewEventsClient(conn),
		version:    versionapi.NewVersionClient(conn),
		snapshots:  snapshotsapi.NewSnapshotsClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// SnapshotService returns the snapshotter of that name; with it the
// Client is an oci.Client.
func (c *Client) SnapshotService(name string) snapshots.Snapshotter {
	return NewSnapshotter(c.snapshots, name)
}

// Version returns containerd's version.
func (c *Client) Version(ctx context.Context) (string, error) {
	v, err := c.version.Version(ctx, &emptypb.Empty{})
	if err != nil {
		return "", Native(err)
	}
	return v.Version, nil
}

// Native converts an error of a gRPC call to containerd to one that
// errdefs classifies (errdefs.IsNotFound and the like). Errors of the
// stores are converted already.
func Native(err error) error { return errgrpc.ToNative(err) }

// Envelope is one event from containerd.
type Envelope struct {
	Timestamp time.Time
	Namespace string
	Topic     string
	Event     typeurl.Any
}

// Subscribe streams containerd's events that match any of filters (as
// `ctr events` takes them) until ctx ends or the stream breaks: then the
// error channel gives why and is closed.
func (c *Client) Subscribe(ctx context.Context, filters ...string) (<-chan *Envelope, <-chan error) {
	evq, errq := make(chan *Envelope), make(chan error, 1)
	session, err := c.events.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: filters})
	if err != nil {
		errq <- Native(err)
		close(errq)
		return evq, errq
	}
	go func() {
		defer close(errq)
		for {
			ev, err := session.Recv()
			if err != nil {
				errq <- Native(err)
				return
			}
			select {
			case evq <- &Envelope{Timestamp: ev.Timestamp.AsTime(), Namespace: ev.Namespace, Topic: ev.Topic, Event: ev.Event}:
			case <-ctx.Done():
				if ctx.Err() != context.Canceled {
					errq <- ctx.Err()
				}
				return
			}
		}
	}()
	return evq, errq
}
