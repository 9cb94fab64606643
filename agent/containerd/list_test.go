package containerd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	apitask "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
)

// stoppedTask is a task service with one stopped task, exited 3, which
// its Delete takes away.
type stoppedTask struct {
	tasks.TasksClient // methods the test does not expect panic
	deleted           bool
}

func (s *stoppedTask) Get(_ context.Context, r *tasks.GetRequest, _ ...grpc.CallOption) (*tasks.GetResponse, error) {
	if s.deleted {
		return nil, errgrpc.ToGRPC(fmt.Errorf("task %s: %w", r.ContainerID, errdefs.ErrNotFound))
	}
	return &tasks.GetResponse{Process: &apitask.Process{ID: r.ContainerID, Pid: noPID, Status: apitask.Status_STOPPED, ExitStatus: 3}}, nil
}

func (s *stoppedTask) Delete(_ context.Context, r *tasks.DeleteTaskRequest, _ ...grpc.CallOption) (*tasks.DeleteResponse, error) {
	s.deleted = true
	return &tasks.DeleteResponse{ID: r.ContainerID, Pid: noPID, ExitStatus: 3}, nil
}

// removedAfterList is a container store whose one container was removed
// by something other than the agent just after the agent listed it.
type removedAfterList struct{ *oneContainer }

func (o removedAfterList) Get(_ context.Context, id string) (containers.Container, error) {
	return containers.Container{}, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
}

func (o removedAfterList) Update(_ context.Context, c containers.Container, _ ...string) (containers.Container, error) {
	return containers.Container{}, fmt.Errorf("container %s: %w", c.ID, errdefs.ErrNotFound)
}

// TestListSkipsAContainerRemovedBehindIt: a container whose task the list
// finds stopped, and which is removed before its exit is recorded (by
// ctr, or a test's teardown), is left out of the list, which does not
// fail; what was held to be written for it is dropped.
func TestListSkipsAContainerRemovedBehindIt(t *testing.T) {
	dir := t.TempDir()
	id := "0123456789ab-main-0"
	store := removedAfterList{testContainer(dir, id, nil)}
	clk := clocktest.New(time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	ts := &stoppedTask{}
	r := testRuntime(t, dir, clk, ts, store)
	r.writeBehind(id, map[string]string{agent.LabelStartedAt: "2026-12-06T02:00:00Z"})
	cs, err := r.List(context.Background(), "")
	if err != nil {
		t.Fatalf("list with a container removed behind it: %v", err)
	}
	if len(cs) != 0 {
		t.Fatalf("list: %+v; want the removed container left out", cs)
	}
	if !ts.deleted {
		t.Error("the stopped task was not deleted")
	}
	if p := r.pending(id); p != nil {
		t.Errorf("labels held for a removed container: %v", p)
	}
}
