package bridge

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Replicas share the fleet (Config.Shards > 0).
//
// The nodes are split into Shards shards by a hash of their name
// (ShardOf). Each shard has a coordination/v1 Lease in Config.Namespace,
// outpost-bridge-shard-N, and only the replica that holds it serves the
// shard's nodes: their Node, Lease and pod statuses, and their desired
// state on the broker. Each replica also holds a member Lease of its own,
// outpost-bridge-member-ID, so that every replica knows how many are
// alive and takes its fair share, ceil(shards / live): it takes free or
// expired shards up to it and gives back those above it. A replica that
// dies stops renewing; the others take its shards once their Leases
// expire (LeaseDuration after the last renew, as they saw it), so its
// nodes move within LeaseDuration and two renew intervals (one to see its
// last renew, one to take the shard), 12 s. A replica that
// cannot renew stops serving its shards before the Lease could expire. A
// shard is given back only after its nodes stopped, and taken only when
// free or expired, so a node has at most one owner at a time. Shard 0's
// holder also publishes the cluster's Services and EndpointSlices. No
// other coordination: the Leases in the API server are all of it.
const (
	leaseLabel  = "outpost.io/bridge-lease" // "shard" or "member"
	shardPrefix = "outpost-bridge-shard-"
	memberPfx   = "outpost-bridge-member-"
	// LeaseDuration and RenewInterval are the shard and member Leases'.
	LeaseDuration = 8 * time.Second
	RenewInterval = 2 * time.Second
	// giveUp is how long after its last renew a replica stops serving a
	// shard it could not renew: before anyone may take it.
	giveUp = LeaseDuration - 3*time.Second
)

// ShardOf is the shard of node name among n.
func ShardOf(name string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}

// observed is a Lease as this replica saw it change: a Lease whose
// resourceVersion did not change for LeaseDuration by the local clock
// has expired, whatever the clocks of the others say.
type observed struct {
	rv   string
	seen time.Time
}

// sharder runs the Leases of one replica; one goroutine (run) owns it.
type sharder struct {
	b  *Bridge
	n  int
	id string
	ns string
	// seen are the Leases as observed, by name.
	seen map[string]observed
	// held are the shards held: the Lease as last written, and when.
	held    map[int]*coordv1.Lease
	renewed map[int]time.Time
	member  *coordv1.Lease
}

func newSharder(b *Bridge) *sharder {
	return &sharder{b: b, n: b.cfg.Shards, id: b.cfg.Identity, ns: b.cfg.Namespace,
		seen: map[string]observed{}, held: map[int]*coordv1.Lease{}, renewed: map[int]time.Time{}}
}

// run renews and balances every RenewInterval until ctx ends, then
// gives back every shard it holds.
func (s *sharder) run(ctx context.Context) {
	t := s.b.deps.Clock.NewTicker(RenewInterval)
	defer t.Stop()
	for {
		s.tick(ctx)
		select {
		case <-ctx.Done():
			s.releaseAll()
			return
		case <-t.C():
		}
	}
}

// tick is one round: read the Leases, renew, give back, take.
func (s *sharder) tick(ctx context.Context) {
	now := s.b.deps.Clock.Now()
	c := s.b.deps.Client.Coordination
	var list coordv1.LeaseList
	rctx, cancel := context.WithTimeout(ctx, RenewInterval)
	err := c.Get().Namespace(s.ns).Resource("leases").
		VersionedParams(&metav1.ListOptions{LabelSelector: leaseLabel}, metav1.ParameterCodec).Do(rctx).Into(&list)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.b.log.Warn("list bridge leases", "namespace", s.ns, "err", err)
		}
		s.expireHeld(now)
		return
	}
	byName := map[string]*coordv1.Lease{}
	for i := range list.Items {
		l := &list.Items[i]
		byName[l.Name] = l
		if o, ok := s.seen[l.Name]; !ok || o.rv != l.ResourceVersion {
			s.seen[l.Name] = observed{rv: l.ResourceVersion, seen: now}
		}
	}
	for name := range s.seen {
		if byName[name] == nil {
			delete(s.seen, name)
		}
	}
	expired := func(l *coordv1.Lease) bool {
		return holder(l) == "" || now.Sub(s.seen[l.Name].seen) >= LeaseDuration
	}

	// This replica's member Lease, and who else is alive.
	if m := s.write(ctx, byName[memberPfx+s.id], memberPfx+s.id, "member"); m != nil {
		s.member = m
	}
	live := 1
	for name, l := range byName {
		if l.Labels[leaseLabel] != "member" || name == memberPfx+s.id {
			continue
		}
		if !expired(l) {
			live++
		} else if now.Sub(s.seen[name].seen) >= 3*LeaseDuration {
			// A replica long gone: its member Lease is removed, by
			// whichever replica sees it first.
			rv := l.ResourceVersion
			dctx, cancel := context.WithTimeout(ctx, RenewInterval)
			c.Delete().Namespace(s.ns).Resource("leases").Name(name).
				Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}).Do(dctx)
			cancel()
		}
	}
	share := (s.n + live - 1) / live

	// Renew what is held; what changed hands is lost.
	for _, i := range slices.Sorted(maps.Keys(s.held)) {
		l := byName[shardPrefix+strconv.Itoa(i)]
		if l == nil || holder(l) != s.id || l.ResourceVersion != s.held[i].ResourceVersion {
			s.b.log.Warn("bridge shard lost", "shard", i)
			s.drop(i)
			continue
		}
		if got := s.write(ctx, l, l.Name, "shard"); got != nil {
			s.held[i], s.renewed[i] = got, now
		} else if now.Sub(s.renewed[i]) >= giveUp {
			s.b.log.Warn("bridge shard not renewed in time; its nodes stop here", "shard", i)
			s.drop(i)
		}
	}
	// Give back what is above the share, its nodes stopped first.
	for len(s.held) > share {
		i := slices.Max(slices.Collect(maps.Keys(s.held)))
		s.release(ctx, i)
	}
	// Take free or expired shards up to the share, starting at a place
	// of this replica's own so that replicas starting together do not
	// all reach for the same ones.
	start := ShardOf(s.id, s.n)
	for k := 0; k < s.n && len(s.held) < share; k++ {
		i := (start + k) % s.n
		if s.held[i] != nil {
			continue
		}
		name := shardPrefix + strconv.Itoa(i)
		l := byName[name]
		if l != nil && !expired(l) {
			continue
		}
		got := s.write(ctx, l, name, "shard")
		if got == nil {
			continue
		}
		s.held[i], s.renewed[i] = got, now
		s.b.log.Info("bridge shard taken", "shard", i, "replicas", live, "share", share)
		s.b.gainShard(i)
	}
}

// write creates the Lease name (when old is nil) or updates old, held
// by this replica and renewed now; it returns the Lease written, or nil
// when it was not (someone else wrote it first, or the API server
// failed).
func (s *sharder) write(ctx context.Context, old *coordv1.Lease, name, kind string) *coordv1.Lease {
	now := metav1.NewMicroTime(s.b.deps.Clock.Now())
	dur := int32(LeaseDuration / time.Second)
	id := s.id
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Labels: map[string]string{leaseLabel: kind}},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, RenewTime: &now, AcquireTime: &now},
	}
	if old != nil {
		l = old.DeepCopy()
		if holder(old) != s.id {
			l.Spec.AcquireTime = &now
			t := int32(0)
			if old.Spec.LeaseTransitions != nil {
				t = *old.Spec.LeaseTransitions
			}
			t++
			l.Spec.LeaseTransitions = &t
		}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &id, &dur, &now
	}
	c := s.b.deps.Client.Coordination
	rctx, cancel := context.WithTimeout(ctx, RenewInterval)
	defer cancel()
	var got coordv1.Lease
	var err error
	if old == nil {
		err = c.Post().Namespace(s.ns).Resource("leases").Body(l).Do(rctx).Into(&got)
	} else {
		err = c.Put().Namespace(s.ns).Resource("leases").Name(name).Body(l).Do(rctx).Into(&got)
	}
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			s.b.log.Warn("write bridge lease", "lease", s.ns+"/"+name, "err", err)
		}
		return nil
	}
	s.seen[name] = observed{rv: got.ResourceVersion, seen: s.b.deps.Clock.Now()}
	return &got
}

// expireHeld stops the shards not renewed for giveUp (the API server
// is not reachable).
func (s *sharder) expireHeld(now time.Time) {
	for i := range s.held {
		if now.Sub(s.renewed[i]) >= giveUp {
			s.b.log.Warn("bridge shard not renewed in time; its nodes stop here", "shard", i)
			s.drop(i)
		}
	}
}

// drop stops serving shard i.
func (s *sharder) drop(i int) {
	delete(s.held, i)
	delete(s.renewed, i)
	s.b.loseShard(i)
}

// release stops shard i's nodes, then gives its Lease back (no holder),
// so another replica takes it at once.
func (s *sharder) release(ctx context.Context, i int) {
	l := s.held[i]
	s.drop(i)
	free := l.DeepCopy()
	free.Spec.HolderIdentity = nil
	rctx, cancel := context.WithTimeout(ctx, RenewInterval)
	defer cancel()
	if err := s.b.deps.Client.Coordination.Put().Namespace(s.ns).Resource("leases").Name(l.Name).Body(free).Do(rctx).Error(); err != nil {
		s.b.log.Info("give back bridge shard; it expires instead", "shard", i, "err", err)
		return
	}
	s.b.log.Info("bridge shard given back", "shard", i)
}

// releaseAll gives back every shard and the member Lease, on the way
// out (ctx has ended: a context of its own bounds it).
func (s *sharder) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*RenewInterval)
	defer cancel()
	for _, i := range slices.Sorted(maps.Keys(s.held)) {
		s.release(ctx, i)
	}
	if s.member != nil {
		rv := s.member.ResourceVersion
		s.b.deps.Client.Coordination.Delete().Namespace(s.ns).Resource("leases").Name(s.member.Name).
			Body(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}).Do(ctx)
	}
}

func holder(l *coordv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// checkIdentity says whether id can name a member Lease.
func checkIdentity(id string) error {
	if id == "" {
		return fmt.Errorf("empty")
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return fmt.Errorf("%q: only lowercase letters, digits, '-' and '.' (a replica's identity names its Lease)", id)
		}
	}
	return nil
}
