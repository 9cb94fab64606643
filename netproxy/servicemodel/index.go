package servicemodel

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/outpost-edge/outpost/store"
)

// Index is the service model kept up to date object by object, so that
// what a change costs depends on what changed and not on how many
// Services there are. The proxy tells it which Services and
// EndpointSlices the store reports changed; Pending names the Services
// the next Build builds (those, plus the few that depend on local pods:
// a standalone Service, or one with a local endpoint, whose readiness may
// have changed) and their slices; the proxy reads just those from the
// store and Build builds them and returns the ServicePorts that changed.
// It keeps what it built and which slices belong to which Service, not
// the objects, which the store has: at 10,000 Services the decoded
// objects would be most of the agent's heap. What it builds is what
// Build builds from the same objects. An Index is for one goroutine.
type Index struct {
	node     string
	services map[string]struct{}     // the keys (namespace/name) of the stored Services
	owner    map[string]string       // slice key: the key of the Service it belongs to
	bySvc    map[string][]string     // Service key: its slices' keys, sorted
	built    map[string]builtService // by Service key
	volatile map[string]struct{}     // Services built at every Build
	dirty    map[string]struct{}     // Services to build at the next Build
	podsKey  string                  // podIndex.key of the last Build
	pods     *podIndex               // of the last Pending
	pending  []string                // the Services the next Build builds
	ports    int
	started  bool
}

// builtService is what was last built of one Service. Its ServicePorts
// are never changed once built: a Table that shares them
// (nft.Table.ShareServicePorts) keeps these and no copies.
type builtService struct {
	ports []*ServicePort
	names []string // ports[i].String()
}

// PortChange is one ServicePort that a Build added or changed (Port set)
// or removed (Port nil), named by its String().
type PortChange struct {
	Key  string
	Port *ServicePort
}

// Objects are the stored objects a Build reads, by key (namespace/name):
// those Pending named that the store holds.
type Objects struct {
	Services map[string]store.Record[*corev1.Service]
	Slices   map[string]store.Record[*discoveryv1.EndpointSlice]
}

// NewIndex returns an empty Index for node (slice endpoints with this
// nodeName are local).
func NewIndex(node string) *Index {
	return &Index{
		node:     node,
		services: map[string]struct{}{},
		owner:    map[string]string{},
		bySvc:    map[string][]string{},
		built:    map[string]builtService{},
		volatile: map[string]struct{}{},
		dirty:    map[string]struct{}{},
	}
}

// ServiceChanged records that the Service under key was put (stored
// true) or deleted.
func (x *Index) ServiceChanged(key string, stored bool) {
	if stored {
		x.services[key] = struct{}{}
	} else {
		delete(x.services, key)
	}
	x.dirty[key] = struct{}{}
}

// SliceChanged records that the EndpointSlice under key was put, and
// now belongs to the Service with key svc (namespace and
// kubernetes.io/service-name label; "" for none), or deleted (svc "").
func (x *Index) SliceChanged(key, svc string) {
	if old, ok := x.owner[key]; ok {
		if old == svc {
			x.dirty[svc] = struct{}{}
			return
		}
		delete(x.owner, key)
		group := slices.DeleteFunc(x.bySvc[old], func(k string) bool { return k == key })
		if len(group) == 0 {
			delete(x.bySvc, old)
		} else {
			x.bySvc[old] = group
		}
		x.dirty[old] = struct{}{}
	}
	if svc == "" {
		return
	}
	x.owner[key] = svc
	group := x.bySvc[svc]
	i, _ := slices.BinarySearch(group, key)
	x.bySvc[svc] = slices.Insert(group, i, key)
	x.dirty[svc] = struct{}{}
}

// SliceOwner is the key of the Service an EndpointSlice belongs to, ""
// for none.
func SliceOwner(s *discoveryv1.EndpointSlice) string {
	if s == nil || s.Labels[discoveryv1.LabelServiceName] == "" {
		return ""
	}
	return store.Key(s.Namespace, s.Labels[discoveryv1.LabelServiceName])
}

// Pending returns the keys of the Services the next Build builds, with
// the local pods as they are now, and of their EndpointSlices, sorted.
// When the local pods or their addresses changed (not their readiness),
// that is every Service: any slice endpoint may have become, or stopped
// being, a local pod.
func (x *Index) Pending(local []LocalPod) (services, slices []string) {
	x.pods = newPodIndex(local)
	if k := x.pods.key(); k != x.podsKey || !x.started {
		x.podsKey, x.started = k, true
		for key := range x.services {
			x.dirty[key] = struct{}{}
		}
	}
	for key := range x.volatile {
		x.dirty[key] = struct{}{}
	}
	x.pending = sortedKeys(x.dirty)
	var sls []string
	for _, key := range x.pending {
		sls = append(sls, x.bySvc[key]...)
	}
	return x.pending, sls
}

func sortedKeys(m map[string]struct{}) []string { return slices.Sorted(maps.Keys(m)) }

// Build builds the Services Pending named from objs and returns the
// ServicePorts that changed, sorted by key, with one error per Service,
// port or address of those it skipped (as Build does). A slice in objs
// that no longer belongs to the Service (relabelled since SliceChanged)
// is left out: its change comes next.
func (x *Index) Build(objs Objects) ([]PortChange, []error) {
	if x.pods == nil {
		x.Pending(nil)
	}
	for _, key := range x.pending {
		delete(x.dirty, key)
	}
	if len(x.dirty) == 0 && len(x.pending) > 256 {
		x.dirty = map[string]struct{}{} // a map never shrinks: drop the big one
	}
	var changes []PortChange
	var errs []error
	for _, key := range x.pending {
		var cur builtService
		delete(x.volatile, key)
		if rec, ok := objs.Services[key]; ok && rec.Object != nil {
			b := newBuilder(x.node, x.pods, rec)
			if !b.standalone {
				for _, sk := range x.bySvc[key] {
					if sl := objs.Slices[sk].Object; sl != nil && SliceOwner(sl) == key {
						b.slices = append(b.slices, sl)
					}
				}
			}
			built := b.build()
			for i := range built {
				name := built[i].String()
				if slices.Contains(cur.names, name) {
					continue // the first one counts, as in the table
				}
				cur.ports, cur.names = append(cur.ports, &built[i]), append(cur.names, name)
			}
			errs = append(errs, b.errs...)
			if b.standalone || b.local {
				x.volatile[key] = struct{}{}
			}
		}
		old := x.built[key]
		for _, name := range old.names {
			if !slices.Contains(cur.names, name) {
				changes = append(changes, PortChange{Key: name})
			}
		}
		for i := range cur.ports {
			changes = append(changes, PortChange{Key: cur.names[i], Port: cur.ports[i]})
		}
		x.ports += len(cur.ports) - len(old.ports)
		if len(cur.ports) == 0 {
			delete(x.built, key)
		} else {
			x.built[key] = cur
		}
	}
	x.pending, x.pods = nil, nil
	slices.SortStableFunc(changes, func(a, b PortChange) int { return strings.Compare(a.Key, b.Key) })
	return changes, errs
}

// Ports returns every ServicePort as last built, sorted by String(). The
// Index keeps these from then on instead of its own, so that a Table
// that keeps them (a full sync) shares them: treat them as read-only.
func (x *Index) Ports() []ServicePort {
	type slot struct {
		name string
		p    **ServicePort
	}
	slots := make([]slot, 0, x.ports)
	for _, e := range x.built {
		for i := range e.ports {
			slots = append(slots, slot{e.names[i], &e.ports[i]})
		}
	}
	slices.SortFunc(slots, func(a, b slot) int { return strings.Compare(a.name, b.name) })
	out := make([]ServicePort, len(slots))
	for i, s := range slots {
		out[i] = **s.p
		*s.p = &out[i]
	}
	return out
}

// Len returns the number of ServicePorts as last built.
func (x *Index) Len() int { return x.ports }
