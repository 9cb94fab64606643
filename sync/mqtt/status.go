package mqtt

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
)

// The status sink.
//
// Pod statuses are in the store's journal already (the agent writes them
// on every transition); the node's status is written there too, under
// NodeJournalKey, when it changes. The journal is the outbox: an entry is
// published retained at QoS 1 with its sequence number as generation, and
// acknowledged (removed) only after the broker's PUBACK on a connection
// that was still up. A status superseded before it is sent is never sent.

const (
	// statusBatch is how many journal entries one read takes.
	statusBatch = 64
	// eventBufferSize bounds the events waiting to be sent; the oldest
	// is dropped first.
	eventBufferSize = 64
)

// NodeJournalKey is the journal key of the node's status.
func NodeJournalKey(node string) string { return "node/" + node }

// drain publishes the journal and the queued events, and clears the
// retained status of pods no longer in the store, until ctx ends or a
// publish fails.
func (s *Syncer) drain(ctx context.Context, conn Conn) error {
	journal, cancel := s.deps.Store.Subscribe(store.KindJournal)
	defer cancel()
	pods, cancelPods := s.deps.Store.Subscribe(store.KindPod)
	defer cancelPods()
	for {
		if err := s.drainJournal(ctx, conn); err != nil {
			return err
		}
		if err := s.clearGone(ctx, conn); err != nil {
			return err
		}
		if err := s.sendEvents(ctx, conn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-journal:
		case <-pods:
		case <-s.events.wake:
		}
	}
}

// clearGone empties the retained status topic of every pod whose status
// this agent published and that the store no longer holds (deleted over
// MQTT, or a static pod whose manifest went), so a bridge started later
// finds no status of it and the static pod's mirror pod goes.
func (s *Syncer) clearGone(ctx context.Context, conn Conn) error {
	if len(s.sent) == 0 {
		return nil
	}
	recs, err := s.deps.Store.Pods().List()
	if err != nil {
		return nil // cleared on a later pass
	}
	have := make(map[string]bool, len(recs))
	for _, r := range recs {
		have[store.Key(r.Object.Namespace, r.Object.Name)] = true
	}
	for key := range s.sent {
		if have[key] {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		if err := s.publish(ctx, conn, PodStatusTopic(s.cfg.NodeName, ns, name), true, nil, "status-pods"); err != nil {
			return err
		}
		delete(s.sent, key)
	}
	return nil
}

func (s *Syncer) drainJournal(ctx context.Context, conn Conn) error {
	after := uint64(0)
	for {
		es, err := s.deps.Store.Pending(after, statusBatch)
		if err != nil {
			return fmt.Errorf("read status journal: %w", err)
		}
		if len(es) == 0 {
			return nil
		}
		for _, e := range es {
			after = e.Seq
			topic, payload, kind, err := s.statusMessage(e)
			if err != nil {
				s.log.Info("status not sent", "key", e.Key, "err", err)
			}
			if topic != "" {
				if err := s.publish(ctx, conn, topic, true, payload, kind); err != nil {
					return err
				}
				s.notePublished()
				if ns, name, ok := strings.Cut(strings.TrimPrefix(e.Key, "pod/"), "/"); ok && kind == "status-pods" {
					s.sent[store.Key(ns, name)] = true
				}
			}
			if _, err := s.deps.Store.Ack(e); err != nil {
				return fmt.Errorf("acknowledge status %s: %w", e.Key, err)
			}
		}
	}
}

// statusMessage is the message of a journal entry; no topic means there
// is nothing to send (the pod is gone, the entry is not ours), and a
// non-nil error says why.
func (s *Syncer) statusMessage(e store.Entry) (topic string, payload []byte, kind string, err error) {
	node := s.cfg.NodeName
	env := Envelope{Generation: e.Seq, Encoding: EncodingProtobuf, Issued: s.deps.Clock.Now()}
	if e.Key == NodeJournalKey(node) {
		env.Kind, env.Body = "Node", e.Value
		return NodeStatusTopic(node), env.Marshal(), "status-node", nil
	}
	p, err := journalPod(e)
	if err != nil {
		return "", nil, "", err
	}
	rec, ok, err := s.deps.Store.Pods().Get(p.Namespace, p.Name)
	switch {
	case err != nil:
		return "", nil, "", fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	case !ok || rec.Object.UID != p.UID:
		return "", nil, "", nil // gone, or replaced: its status means nothing
	}
	env.Kind, env.Body = "Pod", e.Value
	if rec.Source == store.SourceStatic {
		// The bridge makes the mirror pod from it: the whole pod.
		full := rec.Object.DeepCopy()
		full.Status = p.Status
		if env.Body, err = full.Marshal(); err != nil {
			return "", nil, "", fmt.Errorf("pod %s/%s: encode: %w", p.Namespace, p.Name, err)
		}
	}
	return PodStatusTopic(node, p.Namespace, p.Name), env.Marshal(), "status-pods", nil
}

// journalPod decodes a journal entry of a pod status (agent.JournalKey:
// "pod/NAMESPACE/NAME", a Pod with namespace, name, uid and status).
func journalPod(e store.Entry) (*corev1.Pod, error) {
	rest, ok := strings.CutPrefix(e.Key, "pod/")
	if !ok {
		return nil, fmt.Errorf("journal entry %s: not a status this sink sends", e.Key)
	}
	ns, name, _ := strings.Cut(rest, "/")
	var p corev1.Pod
	if err := p.Unmarshal(e.Value); err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", e.Key, err)
	}
	if p.Namespace != ns || p.Name != name || p.UID == "" {
		return nil, fmt.Errorf("journal entry %s: holds the status of pod %s/%s uid %q", e.Key, p.Namespace, p.Name, p.UID)
	}
	return &p, nil
}

// runNodeStatus reads the node's facts every NodeStatusCheck and writes
// the status to the journal when it changed in anything but times: an
// idle node sends nothing, the bridge keeps the heartbeats.
func (s *Syncer) runNodeStatus(ctx context.Context) {
	var last []byte
	tick := s.deps.Clock.NewTicker(s.cfg.NodeStatusCheck)
	defer tick.Stop()
	for {
		data, err := s.nodeStatus()
		if err != nil {
			s.log.Warn("encode node status", "err", err)
		} else if !bytes.Equal(data, last) {
			if _, err := s.deps.Store.Append(NodeJournalKey(s.cfg.NodeName), data); err != nil {
				s.log.Warn("journal node status", "err", err)
			} else {
				last = data
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
}

// journalNodeStatus writes the node's status to the journal whether or
// not it changed.
func (s *Syncer) journalNodeStatus() {
	data, err := s.nodeStatus()
	if err != nil {
		s.log.Warn("encode node status", "err", err)
		return
	}
	if _, err := s.deps.Store.Append(NodeJournalKey(s.cfg.NodeName), data); err != nil {
		s.log.Warn("journal node status", "err", err)
	}
}

// nodeStatus is the node's status as published: a Node with the board's
// labels and the facts' status, its conditions without times.
func (s *Syncer) nodeStatus() ([]byte, error) {
	f := s.deps.NodeFacts()
	st := *f.Status.DeepCopy()
	for i := range st.Conditions {
		st.Conditions[i].LastHeartbeatTime = metav1.Time{}
		st.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	// The bridge registers the Node: the well-known labels are the
	// board's, not the bridge's.
	labels := map[string]string{corev1.LabelArchStable: runtime.GOARCH, corev1.LabelOSStable: "linux"}
	maps.Copy(labels, f.Labels)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName, Labels: labels}, Status: st}
	if s.cfg.SealKey != nil {
		n.Annotations = map[string]string{AnnotationSealKey: s.cfg.SealKey.Public()}
	}
	return n.Marshal()
}

// eventQueue holds the events waiting to be sent. Events live only in
// memory, best effort, as in sync/kube.
type eventQueue struct {
	mu   sync.Mutex
	evs  []*corev1.Event
	seq  uint64
	wake chan struct{}
}

// Event queues a core/v1 Event about pod, to be published on the node's
// events topic once the broker is reachable. Repeats while it waits
// count up. It never blocks.
func (s *Syncer) Event(pod *corev1.Pod, typ, reason, message string, at time.Time) {
	if pod == nil || pod.UID == "" || reason == "" {
		return
	}
	if typ == "" {
		typ = corev1.EventTypeNormal
	}
	q := &s.events
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.evs {
		if e.InvolvedObject.UID == pod.UID && e.Type == typ && e.Reason == reason && e.Message == message {
			e.Count++
			e.LastTimestamp = metav1.NewTime(at)
			return
		}
	}
	if len(q.evs) >= eventBufferSize {
		q.evs = q.evs[1:]
	}
	q.seq++
	q.evs = append(q.evs, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: fmt.Sprintf("%s.%x.%d", pod.Name, at.UnixNano(), q.seq)},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		},
		Reason: reason, Message: message, Type: typ,
		Source:         corev1.EventSource{Component: "outpost", Host: s.cfg.NodeName},
		FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at), Count: 1,
	})
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// sendEvents publishes the queued events (QoS 1, not retained); one that
// cannot be sent goes back to the queue, within its bound.
func (s *Syncer) sendEvents(ctx context.Context, conn Conn) error {
	q := &s.events
	q.mu.Lock()
	evs := q.evs
	q.evs = nil
	seq := q.seq
	q.mu.Unlock()
	for i, ev := range evs {
		body, err := ev.Marshal()
		if err != nil {
			continue
		}
		env := Envelope{Kind: "Event", Generation: seq, Encoding: EncodingProtobuf, Issued: s.deps.Clock.Now(), Body: body}
		if err := s.publish(ctx, conn, EventsTopic(s.cfg.NodeName), false, env.Marshal(), "events"); err != nil {
			q.mu.Lock()
			rest := append(evs[i:], q.evs...)
			if len(rest) > eventBufferSize {
				rest = rest[len(rest)-eventBufferSize:]
			}
			q.evs = rest
			q.mu.Unlock()
			return err
		}
	}
	return nil
}
