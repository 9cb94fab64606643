package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The Node and its Lease are owned by one goroutine, runNode:
//
//   - connect: get the Node (create it when missing, else merge our labels
//     in), write its status, renew the Lease; then the link is up and the
//     node synced, and pod statuses may follow.
//   - keep alive: every RenewInterval, send the status if it changed
//     (heartbeat times aside) or NodeStatusPeriod passed since the last
//     send (KEP-589), then renew the Lease.
//   - a failed renewal (or connect) takes the link down; the next connect
//     comes after the jittered reconnect backoff.
//   - a Node deleted under us is registered again (new UID, Lease owner
//     updated) when a status patch finds it gone or the Lease is found
//     deleted, as the garbage collector deletes it with its owner. No
//     request is spent looking for it otherwise: without a garbage
//     collector and with no status change, that takes NodeStatusPeriod.

// runNode registers the Node and keeps it and its Lease fresh until ctx
// ends. An API server that cannot be reached or rejects the credential is
// logged (once per kind of failure) and retried; it never stops Run.
func (s *Syncer) runNode(ctx context.Context) {
	n := &nodeLoop{s: s}
	if s.cfg.Lease != nil {
		// Taken, not kept twice for the Syncer's life.
		n.lease, n.listed = keptLease(s.cfg.Lease), true
		s.cfg.Lease = nil
	}
	b := newReconnectBackoff()
	for {
		if s.waitPresent(ctx) != nil {
			return
		}
		var err error
		s.offload(func() { err = n.connect(ctx) })
		if err == nil {
			b.Reset()
			err = n.keepAlive(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errAbsent) {
			s.log.Info("node away; its lease is left to expire", "node", s.cfg.NodeName)
			s.setConnected(false)
			continue
		}
		wait := b.Next()
		n.fail(err, wait)
		if s.sleep(ctx, wait) != nil {
			return
		}
	}
}

// nodeUID returns the UID of the registered Node, or "" until it is
// known; the Lease's and mirror pods' owner references need it.
func (s *Syncer) nodeUID() types.UID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.uid
}

func (s *Syncer) setNodeUID(uid types.UID) {
	if uid == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.uid != uid {
		if s.uid != "" {
			s.log.Info("node registered again", "node", s.cfg.NodeName, "uid", uid, "oldUID", s.uid)
		}
		s.uid = uid
	}
}

// noteForgotten records that the API server did not know the Node
// although the node had been registered (its UID was known, or a resume
// version in the store says an earlier run watched its pods): the
// Node was deleted, or the API server was rebuilt from an empty etcd.
// Either way the watches list again, as their resourceVersions may mean
// nothing to the server, and the status sink looks again at which mirror
// pods exist, as kubelet would find them gone with their Node.
func (s *Syncer) noteForgotten() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgotten++
	s.log.Info("the api server did not know the node; relisting and making mirror pods again", "node", s.cfg.NodeName)
	s.broadcast()
}

// forgottenCount returns how many times the API server forgot the Node
// (noteForgotten) and a channel closed at the next change of it, the
// link or presence.
func (s *Syncer) forgottenCount() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.forgotten, s.changed
}

// wasRegistered reports whether the node had been known to an API server
// before this Node was created: this run learnt a Node UID, or an
// earlier run watched the node's pods (New read its resume version).
func (s *Syncer) wasRegistered() bool {
	return s.nodeUID() != "" || s.resumed
}

// nodeLoop is runNode's state.
type nodeLoop struct {
	s      *Syncer
	status nodeStatusTracker
	// lease is the Lease as last written or read, the base of the next
	// optimistic update; nil when it must be read first.
	lease *coordv1.Lease
	// listed: lease is Config.Lease, not yet renewed.
	listed bool
	// failure is the kind of the last failure logged, "" after a
	// success, so a retry that fails the same way logs nothing.
	failure string
	// statusErr is the last status write error logged, "" after a
	// status was written.
	statusErr string
	// skippedLogged reports whether the labels NodeRestriction would
	// refuse were logged.
	skippedLogged bool
}

// connect brings the link up: Node, then its status, then the Lease.
func (n *nodeLoop) connect(ctx context.Context) error {
	// With LeaseFirst, the Lease before the Node is even read, when it
	// exists: it is what says the node is alive (its owner reference is
	// kept as it is).
	renewed := false
	if n.listed && n.s.cfg.LeaseRenewed {
		// Renewed by whoever listed it, a moment ago.
		n.listed, renewed = false, true
	} else if (n.lease == nil || n.listed) && n.s.cfg.LeaseFirst {
		n.listed = false
		if err := n.s.writes.wait(ctx); err != nil {
			return err
		}
		err := n.renewExisting(ctx)
		if err != nil && !errors.Is(err, errNoLease) && isLinkDown(err) {
			return err
		}
		renewed = err == nil
	}
	created, err := n.ensureNode(ctx)
	if err != nil {
		return err
	}
	if !renewed {
		// Then the Lease: a bridge replica taking over a thousand nodes
		// at once has each renew it before its status.
		if err := n.s.writes.wait(ctx); err != nil {
			return err
		}
		err = n.renewLease(ctx)
		if errors.Is(err, errLeaseGone) {
			err = n.renewLease(ctx) // the Node was looked at just above
		}
		if err != nil {
			return err
		}
	}
	if !created {
		// The node controller may have marked the Node Unknown while we
		// were away: ensureNode compared with what the Node holds, and
		// the status is sent when that differs from ours or its
		// heartbeat is older than NodeStatusPeriod, as kubelet decides
		// after reading the Node.
		if err := n.writeStatus(ctx, true); err != nil {
			if isLinkDown(err) {
				return err
			}
			n.noteStatusErr(err)
		}
	}
	n.up()
	n.s.setNodeSynced()
	return nil
}

// errAbsent ends keepAlive when the node went away (SetPresent).
var errAbsent = errors.New("node away")

// keepAlive renews the Lease every RenewInterval, sending the status
// before when it is due, until a renewal fails or ctx ends.
func (n *nodeLoop) keepAlive(ctx context.Context) error {
	tick := n.s.deps.Clock.NewTicker(n.s.cfg.RenewInterval)
	defer tick.Stop()
	for {
		present, changed := n.s.presence()
		if !present {
			return errAbsent
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			continue
		case <-tick.C():
		}
		var err error
		n.s.offload(func() { err = n.beat(ctx) })
		if err != nil {
			return err
		}
		n.up()
	}
}

// beat sends the status when it is due and renews the Lease.
func (n *nodeLoop) beat(ctx context.Context) error {
	err := n.writeStatus(ctx, false)
	if apierrors.IsNotFound(err) {
		// The Node was deleted under us: register it again.
		err = n.reregister(ctx)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		n.noteStatusErr(err)
	}
	err = n.renewLease(ctx)
	if errors.Is(err, errLeaseGone) {
		// The garbage collector deletes the Lease with its Node.
		if err := n.reregister(ctx); err != nil {
			return err
		}
		err = n.renewLease(ctx)
	}
	return err
}

// reregister makes sure the Node exists and, when it was there already,
// sends its status.
func (n *nodeLoop) reregister(ctx context.Context) error {
	created, err := n.ensureNode(ctx)
	if err != nil || created {
		return err
	}
	return n.writeStatus(ctx, true)
}

func (n *nodeLoop) up() {
	n.failure = ""
	n.s.setConnected(true)
}

// fail records a failed connect or renewal and takes the link down.
// setConnected logs the transition from up; while the link stays down,
// a failure is logged only when its kind changes.
func (n *nodeLoop) fail(err error, retryIn time.Duration) {
	s := n.s
	s.noteErr(err)
	wasUp := s.Link().Connected
	s.setConnected(false)
	kind := linkFailureKind(err)
	if !wasUp && kind != n.failure {
		s.log.Warn("api server not usable; pods keep running from the store",
			"server", s.deps.Client.Config.Host, "node", s.cfg.NodeName, "reason", kind, "err", err, "retryIn", retryIn.Round(time.Millisecond))
	}
	n.failure = kind
}

// noteStatusErr records a status write that failed although the link may
// be up, logging it when it differs from the last one logged.
func (n *nodeLoop) noteStatusErr(err error) {
	n.s.noteErr(err)
	if msg := err.Error(); msg != n.statusErr {
		n.s.log.Warn("node status not written; retrying at the next renewal", "node", n.s.cfg.NodeName, "err", err)
		n.statusErr = msg
	}
}

// linkFailureKind names what went wrong, for the log.
func linkFailureKind(err error) string {
	var st apierrors.APIStatus
	switch {
	case apierrors.IsUnauthorized(err):
		return "the API server rejected the credential"
	case apierrors.IsForbidden(err):
		return "the node identity is not allowed"
	case errors.As(err, &st):
		return fmt.Sprintf("the API server answered %d %s", st.Status().Code, st.Status().Reason)
	default:
		return "the API server is unreachable"
	}
}

// isLinkDown reports whether err says the API server cannot be used now
// (unreachable, overloaded, the credential rejected), rather than that it
// refused one request for what it held.
func isLinkDown(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true
	}
	code := st.Status().Code
	return code == 401 || code == 429 || code >= 500
}

// requestTimeout bounds each request of the loop, so a connection that
// hangs is noticed within about a renewal period, as kubelet's heartbeat
// client does.
func (n *nodeLoop) requestTimeout() time.Duration { return max(n.s.cfg.RenewInterval, 5*time.Second) }

// ensureNode gets the Node, creating it when it does not exist or else
// merging our labels into it, and records its UID. The conditions the
// Node holds seed the transition times, and the next status is sent in
// full: the Node may have changed while we did not look.
func (n *nodeLoop) ensureNode(ctx context.Context) (created bool, err error) {
	s := n.s
	name := s.cfg.NodeName
	for range 2 {
		var node corev1.Node
		err := s.deps.Client.Core.Get().Resource("nodes").Name(name).Timeout(n.requestTimeout()).Do(ctx).Into(&node)
		if apierrors.IsNotFound(err) {
			err = n.createNode(ctx)
			if apierrors.IsAlreadyExists(err) {
				continue // created by someone else meanwhile: read it
			}
			return err == nil, err
		}
		if err != nil {
			return false, fmt.Errorf("get node %s: %w", name, err)
		}
		s.setNodeUID(node.UID)
		n.status.observe(node.Status)
		return false, n.mergeLabels(ctx, &node)
	}
	return false, fmt.Errorf("register node %s: created and deleted again while registering", name)
}

// createNode registers the Node with our labels, the configured taints
// (only at registration, as kubelet's --register-with-taints: the node
// identity may not change taints later) and its status.
func (n *nodeLoop) createNode(ctx context.Context) error {
	s := n.s
	now := s.deps.Clock.Now()
	n.status.observe(corev1.NodeStatus{})
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName, Labels: n.labels(), Annotations: s.deps.NodeFacts().Annotations},
		Spec:       corev1.NodeSpec{Taints: s.cfg.Taints},
		Status:     n.status.build(s.deps.NodeFacts().Status, now),
	}
	if err := s.writes.wait(ctx); err != nil {
		return err
	}
	var got corev1.Node
	if err := s.deps.Client.Core.Post().Resource("nodes").Body(node).Timeout(n.requestTimeout()).Do(ctx).Into(&got); err != nil {
		return fmt.Errorf("create node %s: %w", s.cfg.NodeName, err)
	}
	forgotten := s.wasRegistered()
	s.setNodeUID(got.UID)
	n.status.sent(node.Status, now)
	s.log.Info("node registered", "node", s.cfg.NodeName, "uid", got.UID)
	if forgotten {
		s.noteForgotten()
	}
	return nil
}

// labels are the Node's labels: the well-known three, the node facts'
// and the configured ones, without those NodeRestriction would refuse.
func (n *nodeLoop) labels() map[string]string {
	s := n.s
	l := map[string]string{
		corev1.LabelArchStable: runtime.GOARCH,
		corev1.LabelOSStable:   "linux",
		corev1.LabelHostname:   s.cfg.NodeName,
	}
	maps.Copy(l, s.deps.NodeFacts().Labels)
	maps.Copy(l, s.cfg.Labels)
	var skipped []string
	for k := range l {
		if !nodeMaySetLabel(k) {
			skipped = append(skipped, k)
			delete(l, k)
		}
	}
	if len(skipped) > 0 && !n.skippedLogged {
		slices.Sort(skipped)
		s.log.Warn("node labels a node may not set on itself are skipped (NodeRestriction); an administrator can set them",
			"node", s.cfg.NodeName, "labels", strings.Join(skipped, ","))
		n.skippedLogged = true
	}
	return l
}

// mergeLabels patches into the Node the labels (and the facts'
// annotations) it lacks or has with another value. Labels are never removed: the Node does not say which
// ones were ours. A refused patch is logged, not an error: the Node is
// registered all the same.
func (n *nodeLoop) mergeLabels(ctx context.Context, node *corev1.Node) error {
	s := n.s
	changed, annotations := map[string]string{}, map[string]string{}
	for k, v := range n.labels() {
		if old, ok := node.Labels[k]; !ok || old != v {
			changed[k] = v
		}
	}
	for k, v := range s.deps.NodeFacts().Annotations {
		if old, ok := node.Annotations[k]; !ok || old != v {
			annotations[k] = v
		}
	}
	if len(changed)+len(annotations) == 0 {
		return nil
	}
	meta := map[string]any{}
	if len(changed) > 0 {
		meta["labels"] = changed
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return fmt.Errorf("patch labels of node %s: %w", node.Name, err)
	}
	if err := s.writes.wait(ctx); err != nil {
		return err
	}
	err = s.deps.Client.Core.Patch(types.MergePatchType).Resource("nodes").Name(node.Name).Body(body).Timeout(n.requestTimeout()).Do(ctx).Error()
	if err != nil {
		err = fmt.Errorf("patch labels of node %s: %w", node.Name, err)
		if isLinkDown(err) {
			return err
		}
		s.noteErr(err)
		s.log.Warn("node labels not merged", "node", node.Name, "err", err)
		return nil
	}
	s.log.Info("node labels merged", "node", node.Name, "labels", len(changed), "annotations", len(annotations))
	return nil
}

// nodeMaySetLabel reports whether NodeRestriction admission lets a node
// set the label key on its own Node: any label outside the kubernetes.io
// and k8s.io domains (and their subdomains), and inside them only the
// labels kubelet sets (kubernetes.io/{hostname,arch,os}, the topology,
// failure-domain and instance-type ones, beta.kubernetes.io/{arch,os})
// and those under [*.]kubelet.kubernetes.io/ and [*.]node.kubernetes.io/.
// Labels under node-restriction.kubernetes.io/ are refused.
func nodeMaySetLabel(key string) bool {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return true
	}
	inDomain := func(d string) bool { return ns == d || strings.HasSuffix(ns, "."+d) }
	if !inDomain("kubernetes.io") && !inDomain("k8s.io") {
		return true
	}
	if inDomain(corev1.LabelNamespaceNodeRestriction) {
		return false
	}
	switch key {
	case corev1.LabelHostname, corev1.LabelTopologyZone, corev1.LabelTopologyRegion,
		corev1.LabelFailureDomainBetaZone, corev1.LabelFailureDomainBetaRegion,
		corev1.LabelInstanceType, corev1.LabelInstanceTypeStable,
		corev1.LabelOSStable, corev1.LabelArchStable,
		"beta.kubernetes.io/os", "beta.kubernetes.io/arch":
		return true
	}
	return inDomain(corev1.LabelNamespaceSuffixKubelet) || inDomain(corev1.LabelNamespaceSuffixNode)
}

// writeStatus sends the Node's status when it is due; after the link came
// up (afterConnect) the write waits for the replay limiter. It is a
// strategic merge patch of
// nodes/NAME/status, as kubelet sends: conditions merge by type, so
// conditions others set (node-problem-detector's) stay; addresses are
// replaced whole, as kubelet does, because their merge key is not unique.
func (n *nodeLoop) writeStatus(ctx context.Context, afterConnect bool) error {
	s := n.s
	now := s.deps.Clock.Now()
	st := n.status.build(s.deps.NodeFacts().Status, now)
	if !n.status.due(st, now, s.cfg.NodeStatusPeriod) {
		return nil
	}
	force := afterConnect
	body, err := nodeStatusPatch(n.status.last, st)
	if err != nil {
		return fmt.Errorf("patch status of node %s: %w", s.cfg.NodeName, err)
	}
	if force {
		if err := s.writes.wait(ctx); err != nil {
			return err
		}
	}
	var got corev1.Node
	err = s.deps.Client.Core.Patch(types.StrategicMergePatchType).Resource("nodes").Name(s.cfg.NodeName).SubResource("status").
		Body(body).Timeout(n.requestTimeout()).Do(ctx).Into(&got)
	if err != nil {
		return fmt.Errorf("patch status of node %s: %w", s.cfg.NodeName, err)
	}
	s.setNodeUID(got.UID)
	n.status.sent(st, now)
	n.statusErr = ""
	return nil
}

// nodeStatusPatch is the strategic merge patch from last (nil: unknown) to
// st: the conditions always (their heartbeat), the other fields we own
// when they changed.
func nodeStatusPatch(last *corev1.NodeStatus, st corev1.NodeStatus) ([]byte, error) {
	p := map[string]any{"conditions": st.Conditions}
	changed := func(a, b any) bool {
		if last == nil {
			return true
		}
		x, err1 := json.Marshal(a)
		y, err2 := json.Marshal(b)
		return err1 != nil || err2 != nil || !bytes.Equal(x, y)
	}
	var l corev1.NodeStatus
	if last != nil {
		l = *last
	}
	if changed(l.Capacity, st.Capacity) {
		p["capacity"] = st.Capacity
	}
	if changed(l.Allocatable, st.Allocatable) {
		p["allocatable"] = st.Allocatable
	}
	if changed(l.NodeInfo, st.NodeInfo) {
		p["nodeInfo"] = st.NodeInfo
	}
	if changed(l.DaemonEndpoints, st.DaemonEndpoints) {
		p["daemonEndpoints"] = st.DaemonEndpoints
	}
	if changed(l.Addresses, st.Addresses) {
		addrs := make([]any, 0, len(st.Addresses)+1)
		for _, a := range st.Addresses {
			addrs = append(addrs, a)
		}
		p["addresses"] = append(addrs, map[string]string{"$patch": "replace"})
	}
	return json.Marshal(map[string]any{"status": p})
}

// nodeStatusTracker decides when the Node's status is sent and keeps the
// conditions' transition times.
type nodeStatusTracker struct {
	// prev are the conditions as last built or as the Node had them,
	// by type: a condition whose status is unchanged keeps its
	// lastTransitionTime.
	prev map[corev1.NodeConditionType]corev1.NodeCondition
	// last is the status last sent; nil when it must be sent in full.
	last   *corev1.NodeStatus
	sentAt time.Time
}

// observe takes the conditions the Node has on the API server as the
// base of transition times; the next status is sent in full.
func (t *nodeStatusTracker) observe(st corev1.NodeStatus) {
	t.prev = map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range st.Conditions {
		t.prev[c.Type] = c
	}
	t.last, t.sentAt = nil, time.Time{}
	// What the Node holds of ours counts as sent, as of its Ready
	// heartbeat: a status that reads the same need not be sent again
	// before NodeStatusPeriod.
	owned := corev1.NodeStatus{
		Capacity: st.Capacity, Allocatable: st.Allocatable, NodeInfo: st.NodeInfo,
		DaemonEndpoints: st.DaemonEndpoints, Addresses: st.Addresses,
	}
	for _, c := range st.Conditions {
		switch c.Type {
		case corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure:
			owned.Conditions = append(owned.Conditions, c)
		}
		if c.Type == corev1.NodeReady {
			t.last, t.sentAt = &owned, c.LastHeartbeatTime.Time
		}
	}
}

// build returns the status to publish at now: the facts' status with the
// conditions' heartbeat time now, their transition time kept while their
// status is unchanged, and nodeInfo.kubeletVersion.
func (t *nodeStatusTracker) build(facts corev1.NodeStatus, now time.Time) corev1.NodeStatus {
	st := *facts.DeepCopy()
	ts := metav1.NewTime(now.Truncate(time.Second)) // what the wire keeps
	if t.prev == nil {
		t.prev = map[corev1.NodeConditionType]corev1.NodeCondition{}
	}
	for i := range st.Conditions {
		c := &st.Conditions[i]
		c.LastHeartbeatTime = ts
		if p, ok := t.prev[c.Type]; ok && p.Status == c.Status && !p.LastTransitionTime.IsZero() {
			c.LastTransitionTime = p.LastTransitionTime
		} else {
			c.LastTransitionTime = ts
		}
		t.prev[c.Type] = *c
	}
	st.NodeInfo.KubeletVersion = kubeletVersion
	return st
}

// due reports whether st must be sent at now: nothing was sent yet, it
// differs from the last one sent in anything but heartbeat times, or
// period passed since that send.
func (t *nodeStatusTracker) due(st corev1.NodeStatus, now time.Time, period time.Duration) bool {
	if t.last == nil || now.Sub(t.sentAt) >= period {
		return true
	}
	a, errA := json.Marshal(withoutHeartbeats(*t.last))
	b, errB := json.Marshal(withoutHeartbeats(st))
	return errA != nil || errB != nil || !bytes.Equal(a, b)
}

func (t *nodeStatusTracker) sent(st corev1.NodeStatus, now time.Time) {
	t.last, t.sentAt = &st, now
}

func withoutHeartbeats(st corev1.NodeStatus) corev1.NodeStatus {
	st.Conditions = slices.Clone(st.Conditions)
	for i := range st.Conditions {
		st.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return st
}

// kubeletVersion is nodeInfo.kubeletVersion: the Kubernetes release whose
// API outpost is built against, with semantic-version build metadata
// naming outpost, "v1.37.2+outpost", as k3s reports "v1.37.2+k3s1".
// Build metadata rather than a pre-release ("-outpost") because a
// pre-release sorts before the release, and outpost speaks that
// release's API in full, not a preview of it. The release is read from
// the k8s.io/api module version linked in (v0.37.2 is Kubernetes
// v1.37.2), so it follows go.mod without an edit; fallbackKubeVersion
// serves a binary built without module information.
var kubeletVersion = kubeVersion(debug.ReadBuildInfo())

// fallbackKubeVersion is the Kubernetes release of go.mod's k8s.io/api; a
// test keeps the two in step.
const fallbackKubeVersion = "v1.37.2"

func kubeVersion(info *debug.BuildInfo, ok bool) string {
	v := fallbackKubeVersion
	if ok {
		for _, d := range info.Deps {
			if d.Path != "k8s.io/api" {
				continue
			}
			if d.Replace != nil {
				d = d.Replace
			}
			// v0.MINOR.PATCH[-PRE]; a pseudo-version (v0.0.0-…) says nothing.
			if rest, ok := strings.CutPrefix(d.Version, "v0."); ok && !strings.HasPrefix(rest, "0.") {
				v = "v1." + rest
			}
		}
	}
	if i := strings.IndexByte(v, '+'); i >= 0 {
		v = v[:i]
	}
	return v + "+outpost"
}
