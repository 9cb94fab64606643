package bridge

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/internal/clock"
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
// shards move within LeaseDuration and one observeEvery (to see its last
// renew), 9 s: a replica reads the Leases every observeEvery and takes a
// Lease at the moment it expires, not at its next round. The nodes'
// Leases are renewed right after (gainShards, renewTaken). A replica that
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
	// observeEvery is how often a replica reads the Leases: another's
	// last renew is seen at most this late, and its Leases taken as late
	// after they expired. Read every RenewInterval, a dead replica's
	// shards were taken 8.5–10.8 s after it died.
	observeEvery = time.Second
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
	// other: another replica holds it.
	other bool
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
	// renewedAll is when the last round renewed what is held.
	renewedAll time.Time
}

func newSharder(b *Bridge) *sharder {
	return &sharder{b: b, n: b.cfg.Shards, id: b.cfg.Identity, ns: b.cfg.Namespace,
		seen: map[string]observed{}, held: map[int]*coordv1.Lease{}, renewed: map[int]time.Time{}}
}

// run reads the Leases every observeEvery, and when one another
// replica holds expires, renews every RenewInterval and balances, until
// ctx ends; then it gives back every shard it holds.
func (s *sharder) run(ctx context.Context) {
	t := s.b.deps.Clock.NewTicker(observeEvery)
	defer t.Stop()
	for {
		s.tick(ctx)
		var expiry clock.Timer
		var expired <-chan time.Time
		if d, ok := s.nextExpiry(s.b.deps.Clock.Now()); ok && d < observeEvery {
			expiry = s.b.deps.Clock.NewTimer(d)
			expired = expiry.C()
		}
		select {
		case <-ctx.Done():
			s.releaseAll()
			return
		case <-t.C():
		case <-expired:
		}
		if expiry != nil {
			expiry.Stop()
		}
	}
}

// nextExpiry is how long until the first Lease another replica holds
// expires as this one saw it; false when none will.
func (s *sharder) nextExpiry(now time.Time) (time.Duration, bool) {
	var first time.Duration
	found := false
	for _, o := range s.seen {
		if !o.other {
			continue
		}
		d := o.seen.Add(LeaseDuration).Sub(now)
		if d > 0 && (!found || d < first) {
			first, found = d, true
		}
	}
	return first, found
}

// tick is one round: renew what is held when due (every RenewInterval),
// then read the Leases, give back and take.
//
// The renewals come first and go at once, each from the Lease as this
// replica last wrote it: they need no list, and one slow answer delays
// no other. An API server slowed by the fleet's own writes (2,000 nodes
// connecting at once) made a round of a list and eight renewals in a
// row outlast giveUp, and a replica dropped shards it held.
func (s *sharder) tick(ctx context.Context) {
	now := s.b.deps.Clock.Now()
	// Due at every other tick: a tick that starts a little later than
	// the one before must not put the renewal off by a whole tick.
	if now.Sub(s.renewedAll) > RenewInterval-observeEvery/2 {
		s.renewAll(ctx, now)
		s.renewedAll = now
	}
	s.expireHeld(now)
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
		return
	}
	now = s.b.deps.Clock.Now()
	byName := map[string]*coordv1.Lease{}
	for i := range list.Items {
		l := &list.Items[i]
		byName[l.Name] = l
		o, ok := s.seen[l.Name]
		if !ok || o.rv != l.ResourceVersion {
			o = observed{rv: l.ResourceVersion, seen: now}
		}
		o.other = holder(l) != "" && holder(l) != s.id
		s.seen[l.Name] = o
	}
	for name := range s.seen {
		if byName[name] == nil {
			delete(s.seen, name)
		}
	}
	expired := func(l *coordv1.Lease) bool {
		return holder(l) == "" || now.Sub(s.seen[l.Name].seen) >= LeaseDuration
	}

	// This replica's member Lease when it has none yet (or it was
	// removed), and who else is alive.
	if m := byName[memberPfx+s.id]; s.member == nil || m == nil || holder(m) != s.id {
		if m := s.write(ctx, m, memberPfx+s.id, "member"); m != nil {
			s.wrote(m)
			s.member = m
		}
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

	// What another replica holds now is lost.
	for _, i := range slices.Sorted(maps.Keys(s.held)) {
		if l := byName[shardPrefix+strconv.Itoa(i)]; l == nil || holder(l) != s.id {
			s.b.log.Warn("bridge shard lost", "shard", i)
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
	// all reach for the same ones. The takes go at once, as the
	// renewals do: one after another, under load, the last of eight
	// waited for the seven before it.
	start := ShardOf(s.id, s.n)
	var want []int
	for k := 0; k < s.n && len(s.held)+len(want) < share; k++ {
		i := (start + k) % s.n
		if s.held[i] != nil {
			continue
		}
		l := byName[shardPrefix+strconv.Itoa(i)]
		// A Lease that names this replica is its own, though it does
		// not hold it: a take applied whose answer was lost (timed
		// out under load). Waiting for it to expire would start its
		// nodes LeaseDuration later than the others.
		if l != nil && !expired(l) && holder(l) != s.id {
			continue
		}
		want = append(want, i)
	}
	taken := make([]*coordv1.Lease, len(want))
	var wg sync.WaitGroup
	for k, i := range want {
		name := shardPrefix + strconv.Itoa(i)
		wg.Go(func() { taken[k] = s.write(ctx, byName[name], name, "shard") })
	}
	wg.Wait()
	var got []int
	for k, i := range want {
		if taken[k] == nil {
			continue
		}
		s.wrote(taken[k])
		s.held[i], s.renewed[i] = taken[k], now
		s.b.log.Info("bridge shard taken", "shard", i, "replicas", live, "share", share)
		got = append(got, i)
	}
	if len(got) > 0 {
		s.b.gainShards(got)
	}
}

// renewal is one Lease renewed by renewAll: which shard (-1 for the
// member Lease), and what was written, or why not.
type renewal struct {
	shard int
	got   *coordv1.Lease
	err   error
}

// renewAll renews the held shards and the member Lease at once, each
// from the Lease as last written. A shard another replica wrote since
// is lost; one whose renewal failed otherwise is kept until giveUp.
func (s *sharder) renewAll(ctx context.Context, now time.Time) {
	type job struct {
		shard int
		l     *coordv1.Lease
	}
	var jobs []job
	for i, l := range s.held {
		jobs = append(jobs, job{i, l})
	}
	if s.member != nil {
		jobs = append(jobs, job{-1, s.member})
	}
	results := make(chan renewal, len(jobs))
	for _, j := range jobs {
		go func() {
			got, err := s.renew(ctx, j.l)
			results <- renewal{j.shard, got, err}
		}()
	}
	for range jobs {
		r := <-results
		name := memberPfx + s.id
		if r.shard >= 0 {
			name = shardPrefix + strconv.Itoa(r.shard)
		}
		switch {
		case r.err == nil:
			s.seen[name] = observed{rv: r.got.ResourceVersion, seen: s.b.deps.Clock.Now()}
			if r.shard < 0 {
				s.member = r.got
			} else {
				s.held[r.shard], s.renewed[r.shard] = r.got, now
			}
		case errors.Is(r.err, errLeaseLost):
			if r.shard < 0 {
				s.member = nil // written anew after the next list
			} else {
				s.b.log.Warn("bridge shard lost", "shard", r.shard)
				s.drop(r.shard)
			}
		case ctx.Err() == nil:
			s.b.log.Warn("renew bridge lease", "lease", s.ns+"/"+name, "err", r.err)
		}
	}
}

// errLeaseLost says a Lease is held by another replica, or gone.
var errLeaseLost = errors.New("held by another replica, or gone")

// renew writes l renewed now. When its answer says someone wrote it
// since, it reads it again: still held by this replica, the write before
// was applied and only its answer lost, and it renews once more.
func (s *sharder) renew(ctx context.Context, l *coordv1.Lease) (*coordv1.Lease, error) {
	c := s.b.deps.Client.Coordination
	for range 2 {
		next := l.DeepCopy()
		now := metav1.NewMicroTime(s.b.deps.Clock.Now())
		next.Spec.RenewTime = &now
		rctx, cancel := context.WithTimeout(ctx, RenewInterval)
		var got coordv1.Lease
		err := c.Put().Namespace(s.ns).Resource("leases").Name(l.Name).Body(next).Do(rctx).Into(&got)
		cancel()
		switch {
		case err == nil:
			return &got, nil
		case apierrors.IsNotFound(err):
			return nil, errLeaseLost
		case !apierrors.IsConflict(err):
			return nil, err
		}
		var cur coordv1.Lease
		rctx, cancel = context.WithTimeout(ctx, RenewInterval)
		err = c.Get().Namespace(s.ns).Resource("leases").Name(l.Name).Do(rctx).Into(&cur)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			return nil, errLeaseLost
		case err != nil:
			return nil, err
		case holder(&cur) != s.id:
			return nil, errLeaseLost
		}
		l = &cur
	}
	return nil, fmt.Errorf("lease %s/%s: written by someone else twice", s.ns, l.Name)
}

// write creates the Lease name (when old is nil) or updates old, held
// by this replica and renewed now; it returns the Lease written, or nil
// when it was not (someone else wrote it first, or the API server
// failed). It touches nothing of s, so writes may go at once.
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
	return &got
}

// wrote records a Lease this replica wrote as seen now.
func (s *sharder) wrote(l *coordv1.Lease) {
	s.seen[l.Name] = observed{rv: l.ResourceVersion, seen: s.b.deps.Clock.Now()}
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
