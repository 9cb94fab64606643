// Package podenv builds a container's environment the way kubelet does:
// envFrom first, then env, whose values may expand $(VAR) references to
// earlier variables or come from config maps, secrets, the pod's own fields
// and the container's resources.
//
// The downward API resolvers (FieldRefValue, ResourceFieldRefValue) and
// Expand are exported because the volume package needs the same rules for
// downwardAPI volumes and subPathExpr.
package podenv

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// Kinds of referenced objects, as MissingError.Kind spells them.
const (
	KindConfigMap = "configMap"
	KindSecret    = "secret"
)

// Sources is where Env looks up what a container's environment refers to.
type Sources struct {
	// ConfigMap and Secret return the named object of namespace ns and
	// whether it exists. A nil func finds nothing.
	ConfigMap func(ns, name string) (*corev1.ConfigMap, bool, error)
	Secret    func(ns, name string) (*corev1.Secret, bool, error)
	// PodIP and HostIP answer status.podIP(s) and status.hostIP(s); when
	// empty, the pod's status is used.
	PodIP, HostIP string
	// NodeAllocatable answers resourceFieldRef limits the container (and
	// the pod) does not set, as kubelet does.
	NodeAllocatable corev1.ResourceList
	// Services returns the Services of namespace ns, for the service
	// environment (see Env). A nil func gives none.
	Services func(ns string) ([]*corev1.Service, error)
}

// StoreSources returns Sources reading ConfigMaps and Secrets from the store.
func StoreSources(st *store.Store) Sources {
	return Sources{
		ConfigMap: func(ns, name string) (*corev1.ConfigMap, bool, error) {
			rec, found, err := st.ConfigMaps().Get(ns, name)
			if err != nil || !found {
				return nil, false, err
			}
			return rec.Object, true, nil
		},
		Secret: func(ns, name string) (*corev1.Secret, bool, error) {
			rec, found, err := st.Secrets().Get(ns, name)
			if err != nil || !found {
				return nil, false, err
			}
			return rec.Object, true, nil
		},
		Services: func(ns string) ([]*corev1.Service, error) {
			recs, err := st.Services().ListNamespace(ns)
			out := make([]*corev1.Service, 0, len(recs))
			for _, r := range recs {
				out = append(out, r.Object)
			}
			return out, err
		},
	}
}

// MissingError reports a configMap or secret (or a key in one) that a
// container's environment refers to, that does not exist and is not
// optional. The caller shows the container as waiting with reason
// CreateContainerConfigError.
type MissingError struct {
	Pod       string // namespace/name
	Container string
	Env       string // the variable; empty for an envFrom source
	Kind      string // KindConfigMap or KindSecret
	Name      string // of the configMap or secret
	Key       string // the missing key; empty when the object is missing
}

func (e *MissingError) Error() string {
	where := fmt.Sprintf("pod %s: container %q: ", e.Pod, e.Container)
	if e.Env != "" {
		where += fmt.Sprintf("env %q: ", e.Env)
	} else {
		where += "envFrom: "
	}
	if e.Key == "" {
		return fmt.Sprintf("%s%s %q not found", where, e.Kind, e.Name)
	}
	return fmt.Sprintf("%s%s %q: key %q not found", where, e.Kind, e.Name, e.Key)
}

// Env returns the container's environment as "NAME=value" strings in
// kubelet's order of evaluation: envFrom sources first, in order, each
// source's keys sorted, with its prefix, skipping keys that are not valid
// environment variable names; then env, in order. A variable defined again
// keeps its first position and takes the later value. An env value expands
// $(VAR) references to variables defined before it; $$ is a literal $ and
// an unknown reference is left as written. Values from valueFrom are not
// expanded. A missing configMap, secret or key that is not optional is a
// *MissingError; an optional one leaves the variable (or source) out.
// Last come, in name order, the service variables (kubelet's: see
// serviceEnv) the container does not define itself; env values may refer
// to them.
func Env(pod *corev1.Pod, c *corev1.Container, src Sources) ([]string, error) {
	svcEnv, err := serviceEnv(pod, src)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: container %q: %w", pod.Namespace, pod.Name, c.Name, err)
	}
	r := &resolver{
		pod:        pod,
		c:          c,
		src:        src,
		configMaps: map[string]*corev1.ConfigMap{},
		secrets:    map[string]*corev1.Secret{},
	}
	var env envList
	for i := range c.EnvFrom {
		if err := r.envFrom(&c.EnvFrom[i], &env); err != nil {
			return nil, err
		}
	}
	for i := range c.Env {
		e := &c.Env[i]
		if !ValidName(e.Name) {
			return nil, fmt.Errorf("%s: env[%d]: invalid variable name %q", r.where(), i, e.Name)
		}
		var val string
		switch {
		case e.Value != "":
			val = Expand(e.Value, func(name string) (string, bool) {
				if v, ok := env.lookup(name); ok {
					return v, true
				}
				v, ok := svcEnv[name]
				return v, ok
			})
		case e.ValueFrom != nil:
			v, ok, err := r.valueFrom(e)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue // optional and missing
			}
			val = v
		}
		env.set(e.Name, val)
	}
	for _, k := range slices.Sorted(maps.Keys(svcEnv)) {
		if _, ok := env.lookup(k); !ok {
			env.set(k, svcEnv[k])
		}
	}
	return env.strings(), nil
}

// ValidName reports whether name can be an environment variable name:
// non-empty printable ASCII without '=', the rule the API server applies
// since RelaxedEnvironmentVariableValidation.
func ValidName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == '=' {
			return false
		}
	}
	return true
}

// envList is an ordered set of variables.
type envList struct {
	names []string
	vals  map[string]string
}

func (l *envList) set(name, val string) {
	if l.vals == nil {
		l.vals = map[string]string{}
	}
	if _, ok := l.vals[name]; !ok {
		l.names = append(l.names, name)
	}
	l.vals[name] = val
}

func (l *envList) lookup(name string) (string, bool) {
	v, ok := l.vals[name]
	return v, ok
}

func (l *envList) strings() []string {
	out := make([]string, 0, len(l.names))
	for _, n := range l.names {
		out = append(out, n+"="+l.vals[n])
	}
	return out
}

// resolver answers one container's references, reading each configMap and
// secret at most once.
type resolver struct {
	pod        *corev1.Pod
	c          *corev1.Container
	src        Sources
	configMaps map[string]*corev1.ConfigMap // nil value: not found
	secrets    map[string]*corev1.Secret
}

func (r *resolver) podName() string { return r.pod.Namespace + "/" + r.pod.Name }

func (r *resolver) where() string {
	return fmt.Sprintf("pod %s: container %q", r.podName(), r.c.Name)
}

func (r *resolver) missing(env, kind, name, key string) error {
	return &MissingError{Pod: r.podName(), Container: r.c.Name, Env: env, Kind: kind, Name: name, Key: key}
}

func (r *resolver) configMap(name string) (*corev1.ConfigMap, error) {
	if cm, ok := r.configMaps[name]; ok {
		return cm, nil
	}
	var cm *corev1.ConfigMap
	if r.src.ConfigMap != nil {
		obj, found, err := r.src.ConfigMap(r.pod.Namespace, name)
		if err != nil {
			return nil, fmt.Errorf("%s: get configMap %q: %w", r.where(), name, err)
		}
		if found {
			cm = obj
		}
	}
	r.configMaps[name] = cm
	return cm, nil
}

func (r *resolver) secret(name string) (*corev1.Secret, error) {
	if s, ok := r.secrets[name]; ok {
		return s, nil
	}
	var s *corev1.Secret
	if r.src.Secret != nil {
		obj, found, err := r.src.Secret(r.pod.Namespace, name)
		if err != nil {
			return nil, fmt.Errorf("%s: get secret %q: %w", r.where(), name, err)
		}
		if found {
			s = obj
		}
	}
	r.secrets[name] = s
	return s, nil
}

// SecretData returns a secret's data as the API server would store it:
// stringData entries merged over data.
func SecretData(s *corev1.Secret) map[string][]byte {
	if len(s.StringData) == 0 {
		return s.Data
	}
	out := make(map[string][]byte, len(s.Data)+len(s.StringData))
	for k, v := range s.Data {
		out[k] = v
	}
	for k, v := range s.StringData {
		out[k] = []byte(v)
	}
	return out
}

func (r *resolver) envFrom(from *corev1.EnvFromSource, env *envList) error {
	var data map[string]string
	switch {
	case from.ConfigMapRef != nil:
		ref := from.ConfigMapRef
		cm, err := r.configMap(ref.Name)
		if err != nil {
			return err
		}
		if cm == nil {
			if isTrue(ref.Optional) {
				return nil
			}
			return r.missing("", KindConfigMap, ref.Name, "")
		}
		data = cm.Data
	case from.SecretRef != nil:
		ref := from.SecretRef
		s, err := r.secret(ref.Name)
		if err != nil {
			return err
		}
		if s == nil {
			if isTrue(ref.Optional) {
				return nil
			}
			return r.missing("", KindSecret, ref.Name, "")
		}
		sd := SecretData(s)
		data = make(map[string]string, len(sd))
		for k, v := range sd {
			data[k] = string(v)
		}
	default:
		return nil
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := from.Prefix + k
		if !ValidName(name) {
			continue // kubelet skips these too (and records an event)
		}
		env.set(name, data[k])
	}
	return nil
}

// valueFrom resolves e.ValueFrom; ok is false when an optional reference
// is missing and the variable must be left out.
func (r *resolver) valueFrom(e *corev1.EnvVar) (val string, ok bool, err error) {
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		v, err := FieldRefValue(r.pod, vf.FieldRef, r.src.PodIP, r.src.HostIP)
		if err != nil {
			return "", false, fmt.Errorf("%s: env %q: %w", r.where(), e.Name, err)
		}
		return v, true, nil
	case vf.ResourceFieldRef != nil:
		v, err := ResourceFieldRefValue(r.pod, r.c, vf.ResourceFieldRef, r.src.NodeAllocatable)
		if err != nil {
			return "", false, fmt.Errorf("%s: env %q: %w", r.where(), e.Name, err)
		}
		return v, true, nil
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		cm, err := r.configMap(ref.Name)
		if err != nil {
			return "", false, err
		}
		if cm == nil {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, r.missing(e.Name, KindConfigMap, ref.Name, "")
		}
		v, found := cm.Data[ref.Key]
		if !found {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, r.missing(e.Name, KindConfigMap, ref.Name, ref.Key)
		}
		return v, true, nil
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		s, err := r.secret(ref.Name)
		if err != nil {
			return "", false, err
		}
		if s == nil {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, r.missing(e.Name, KindSecret, ref.Name, "")
		}
		v, found := SecretData(s)[ref.Key]
		if !found {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, r.missing(e.Name, KindSecret, ref.Name, ref.Key)
		}
		return string(v), true, nil
	case vf.FileKeyRef != nil:
		return "", false, fmt.Errorf("%s: env %q: valueFrom.fileKeyRef is not supported", r.where(), e.Name)
	}
	return "", true, nil
}

func isTrue(b *bool) bool { return b != nil && *b }

// envMap turns "NAME=value" strings into a map; a later entry wins.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// Lookup returns a lookup func over env ("NAME=value" strings, a later
// entry winning) for Expand.
func Lookup(env []string) func(name string) (string, bool) {
	m := envMap(env)
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}
