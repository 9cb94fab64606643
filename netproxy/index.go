package netproxy

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
// Services there are: the proxy puts and deletes the Services and
// EndpointSlices the store reports changed, and Build builds again only
// the Services those belong to, plus the few that depend on local pods
// (a standalone Service, or one with a local endpoint, whose readiness
// may have changed), and returns the ServicePorts that changed. What it
// builds is what Build builds from the same objects. An Index is for one
// goroutine.
type Index struct {
	node     string
	services map[string]store.Record[*corev1.Service] // by namespace/name
	slices   map[string]*discoveryv1.EndpointSlice    // by the slice's namespace/name
	owner    map[string]string                        // slice key: the Service key it belongs to
	bySvc    map[string][]*discoveryv1.EndpointSlice  // by Service key, sorted by name
	built    map[string]builtService                  // by Service key
	volatile map[string]struct{}                      // Services built at every Build
	dirty    map[string]struct{}                      // Services to build at the next Build
	pods     string                                   // podIndex.key of the last Build
	ports    int
	started  bool
}

// builtService is what was last built of one Service.
type builtService struct {
	ports []ServicePort
	names []string // ports[i].String()
}

// PortChange is one ServicePort that a Build added or changed (Port set)
// or removed (Port nil), named by its String().
type PortChange struct {
	Key  string
	Port *ServicePort
}

// NewIndex returns an empty Index for node (slice endpoints with this
// nodeName are local).
func NewIndex(node string) *Index {
	return &Index{
		node:     node,
		services: map[string]store.Record[*corev1.Service]{},
		slices:   map[string]*discoveryv1.EndpointSlice{},
		owner:    map[string]string{},
		bySvc:    map[string][]*discoveryv1.EndpointSlice{},
		built:    map[string]builtService{},
		volatile: map[string]struct{}{},
		dirty:    map[string]struct{}{},
	}
}

// PutService adds or replaces a Service.
func (x *Index) PutService(rec store.Record[*corev1.Service]) {
	if rec.Object == nil {
		return
	}
	key := store.Key(rec.Object.Namespace, rec.Object.Name)
	x.services[key] = rec
	x.dirty[key] = struct{}{}
}

// DeleteService removes the Service stored under key (namespace/name).
func (x *Index) DeleteService(key string) {
	if _, ok := x.services[key]; ok {
		delete(x.services, key)
		x.dirty[key] = struct{}{}
	}
}

// PutSlice adds or replaces an EndpointSlice.
func (x *Index) PutSlice(s *discoveryv1.EndpointSlice) {
	if s == nil {
		return
	}
	key := store.Key(s.Namespace, s.Name)
	x.DeleteSlice(key)
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		x.slices[key] = s
		return
	}
	svc := store.Key(s.Namespace, name)
	x.slices[key], x.owner[key] = s, svc
	group := x.bySvc[svc]
	i, _ := slices.BinarySearchFunc(group, s.Name, func(e *discoveryv1.EndpointSlice, n string) int { return strings.Compare(e.Name, n) })
	x.bySvc[svc] = slices.Insert(group, i, s)
	x.dirty[svc] = struct{}{}
}

// DeleteSlice removes the EndpointSlice stored under key (namespace/name).
func (x *Index) DeleteSlice(key string) {
	old, ok := x.slices[key]
	if !ok {
		return
	}
	delete(x.slices, key)
	svc, ok := x.owner[key]
	if !ok {
		return
	}
	delete(x.owner, key)
	group := slices.DeleteFunc(x.bySvc[svc], func(e *discoveryv1.EndpointSlice) bool { return e == old })
	if len(group) == 0 {
		delete(x.bySvc, svc)
	} else {
		x.bySvc[svc] = group
	}
	x.dirty[svc] = struct{}{}
}

// Build builds the Services that changed since the last Build, or
// depend on local pods, and returns the ServicePorts that changed, sorted
// by key, with one error per Service, port or address of those it skipped
// (as Build does). When the local pods or their addresses changed (not
// their readiness), every Service is built again: any slice endpoint may
// have become, or stopped being, a local pod.
func (x *Index) Build(local []LocalPod) ([]PortChange, []error) {
	pods := newPodIndex(local)
	if k := pods.key(); k != x.pods || !x.started {
		x.pods, x.started = k, true
		for key := range x.services {
			x.dirty[key] = struct{}{}
		}
	}
	for key := range x.volatile {
		x.dirty[key] = struct{}{}
	}
	keys := slices.Sorted(maps.Keys(x.dirty))
	clear(x.dirty)
	var changes []PortChange
	var errs []error
	for _, key := range keys {
		var cur builtService
		delete(x.volatile, key)
		if rec, ok := x.services[key]; ok {
			b := newBuilder(x.node, pods, rec)
			if !b.standalone {
				b.slices = x.bySvc[key]
			}
			for _, sp := range b.build() {
				name := sp.String()
				if slices.Contains(cur.names, name) {
					continue // the first one counts, as in the table
				}
				cur.ports, cur.names = append(cur.ports, sp), append(cur.names, name)
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
			changes = append(changes, PortChange{Key: cur.names[i], Port: &cur.ports[i]})
		}
		x.ports += len(cur.ports) - len(old.ports)
		if len(cur.ports) == 0 {
			delete(x.built, key)
		} else {
			x.built[key] = cur
		}
	}
	slices.SortStableFunc(changes, func(a, b PortChange) int { return strings.Compare(a.Key, b.Key) })
	return changes, errs
}

// Ports returns every ServicePort as last built, sorted by String(); they
// share memory with the Index: treat them as read-only.
func (x *Index) Ports() []ServicePort {
	out := make([]ServicePort, 0, x.ports)
	names := make([]string, 0, x.ports)
	for _, key := range slices.Sorted(maps.Keys(x.built)) {
		e := x.built[key]
		out, names = append(out, e.ports...), append(names, e.names...)
	}
	return sortPorts(out, names)
}

// Len returns the number of ServicePorts as last built.
func (x *Index) Len() int { return x.ports }
