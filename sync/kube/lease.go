package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The node's Lease, kube-node-lease/NAME, renewed as kubelet's nodelease
// controller renews it: an update of the Lease last held, with no read
// before (the Lease is ours alone, so the read would nearly always be
// wasted), and on a conflict a read and another try.

// maxLeaseTries is how many conflicts in a row a renewal takes before it
// fails, as kubelet's maxUpdateRetries.
const maxLeaseTries = 5

// errLeaseGone says the Lease we held was deleted; the garbage collector
// does that when the Node, its owner, is deleted, so the Node must be
// looked at before the Lease is created again. (An update of a deleted
// Lease fails on its UID precondition with a conflict, and the read
// that follows finds it gone.)
var errLeaseGone = errors.New("lease deleted")

// errNoLease says renewExisting found no Lease to renew.
var errNoLease = errors.New("no lease")

// renewLease writes the Lease with renewTime now, creating it when it
// does not exist.
func (n *nodeLoop) renewLease(ctx context.Context) error { return n.renew(ctx, true) }

// renewExisting renews the Lease only if there is one: errNoLease when
// there is none (connect creates it once the Node is known).
func (n *nodeLoop) renewExisting(ctx context.Context) error { return n.renew(ctx, false) }

// renew writes the Lease with renewTime now; a Lease that does not exist
// is created when create is set.
func (n *nodeLoop) renew(ctx context.Context, create bool) error {
	s := n.s
	name := s.cfg.NodeName
	c, timeout := s.deps.Client.Coordination, n.requestTimeout()
	held := n.lease != nil
	for range maxLeaseTries {
		if n.lease == nil {
			var got coordv1.Lease
			err := c.Get().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(name).Timeout(timeout).Do(ctx).Into(&got)
			if apierrors.IsNotFound(err) && held {
				return fmt.Errorf("renew lease %s/%s: %w", corev1.NamespaceNodeLease, name, errLeaseGone)
			}
			if apierrors.IsNotFound(err) && !create {
				return errNoLease
			}
			if apierrors.IsNotFound(err) {
				err = c.Post().Namespace(corev1.NamespaceNodeLease).Resource("leases").Body(n.desiredLease(nil)).Timeout(timeout).Do(ctx).Into(&got)
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				if err != nil {
					return fmt.Errorf("create lease %s/%s: %w", corev1.NamespaceNodeLease, name, err)
				}
				n.lease = keptLease(&got)
				return nil
			}
			if err != nil {
				return fmt.Errorf("get lease %s/%s: %w", corev1.NamespaceNodeLease, name, err)
			}
			n.lease = keptLease(&got)
		}
		var got coordv1.Lease
		err := c.Put().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(name).Body(n.desiredLease(n.lease)).Timeout(timeout).Do(ctx).Into(&got)
		switch {
		case err == nil:
			n.lease = keptLease(&got)
			return nil
		case apierrors.IsConflict(err):
			n.lease = nil // someone else wrote it: read it and try again
		case apierrors.IsNotFound(err):
			n.lease = nil
			return fmt.Errorf("renew lease %s/%s: %w", corev1.NamespaceNodeLease, name, errLeaseGone)
		default:
			// Keep n.lease: if the update was applied and only its
			// answer lost, the next try conflicts and reads.
			return fmt.Errorf("renew lease %s/%s: %w", corev1.NamespaceNodeLease, name, err)
		}
	}
	return fmt.Errorf("renew lease %s/%s: %d conflicts in a row", corev1.NamespaceNodeLease, name, maxLeaseTries)
}

// keptLease is l as the node keeps it between renewals: without its
// managedFields, which an update that omits them leaves as they are on
// the server. A bridge keeps a Lease for each of thousands of nodes.
func keptLease(l *coordv1.Lease) *coordv1.Lease {
	l.ManagedFields = nil
	return l
}

// desiredLease returns base (nil: a new Lease) renewed now: held by the
// node for LeaseDuration, owned by the Node so that it goes with it.
func (n *nodeLoop) desiredLease(base *coordv1.Lease) *coordv1.Lease {
	s := n.s
	return renewedLease(base, s.cfg.NodeName, s.cfg.LeaseDuration, s.deps.Clock.Now(), s.nodeUID())
}

// renewedLease returns base (nil: a new Lease) of node name renewed at
// now for duration. Unlike kubelet, which sets the owner only while
// there is none, an owner reference to a Node of another UID (deleted
// and registered again) is replaced; with uid unknown (""), base's
// owner references are kept as they are.
func renewedLease(base *coordv1.Lease, name string, duration time.Duration, now time.Time, uid types.UID) *coordv1.Lease {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease}}
	if base != nil {
		l = base.DeepCopy()
	}
	holder := name
	seconds := int32(max(1, duration.Seconds()))
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &seconds
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if uid != "" {
		owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: name, UID: uid}
		refs := []metav1.OwnerReference{owner}
		for _, r := range l.OwnerReferences {
			if r.APIVersion != "v1" || r.Kind != "Node" {
				refs = append(refs, r)
			}
		}
		l.OwnerReferences = refs
	}
	return l
}

// RenewLease renews a node's Lease l, as read a moment ago, at now
// with the default duration a Syncer gives it: one update, no read and
// no retry. It is for a bridge replica that takes over a thousand nodes
// and renews their Leases before it starts them; each node's Syncer is
// then given the Lease returned (Config.Lease, Config.LeaseRenewed).
// A conflict is returned as it is: that node's Syncer reads its Lease.
func RenewLease(ctx context.Context, c *Client, l *coordv1.Lease, now time.Time) (*coordv1.Lease, error) {
	var got coordv1.Lease
	err := c.Coordination.Put().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(l.Name).
		Body(renewedLease(l, l.Name, defaultLeaseDuration, now, "")).Do(ctx).Into(&got)
	if err != nil {
		return nil, fmt.Errorf("renew lease %s/%s: %w", corev1.NamespaceNodeLease, l.Name, err)
	}
	return keptLease(&got), nil
}
