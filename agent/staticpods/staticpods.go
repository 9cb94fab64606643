// Package staticpods reads the manifest directory: Pod, Service, ConfigMap
// and Secret manifests in *.yaml and *.yml files, turned into the objects
// the agent stores with source "static", the way kubelet treats static pods.
package staticpods

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/internal/yamlcheck"
	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Annotations set on every static object.
const (
	// AnnotationSource is kubelet's config source annotation; "file" here.
	AnnotationSource = "kubernetes.io/config.source"
	// AnnotationHash is kubelet's config hash annotation; the pod UID.
	AnnotationHash = "kubernetes.io/config.hash"
	// AnnotationFile names the manifest file an object came from.
	AnnotationFile = "outpost-edge.io/manifest-file"
	// AnnotationInvalid marks a pod whose manifest has good metadata but a
	// bad spec; its value names every bad field, separated by "; ". Such
	// a pod is recorded so that it shows as Failed rather than vanish, and
	// is never run. Set only by Parse: a manifest's own value is dropped.
	AnnotationInvalid = "outpost-edge.io/invalid"
)

// maxFileSize bounds one manifest file; larger files are refused.
const maxFileSize = 1 << 20

// Manifests is what one read of the directory, or of one file, found.
type Manifests struct {
	// Pods holds the good pods and the invalid ones, which are marked
	// with AnnotationInvalid and also listed in Invalid.
	Pods       []*corev1.Pod
	Services   []*corev1.Service
	ConfigMaps []*corev1.ConfigMap
	// Secrets have their stringData merged into data.
	Secrets []*corev1.Secret
	// Errors has one entry per bad file or document that yields no
	// object, each naming the file.
	Errors []*FileError
	// Invalid has one entry per invalid pod of Pods, naming the file, the
	// document, the pod and every bad field.
	Invalid []*FileError
}

func (m *Manifests) add(o Manifests) {
	m.Pods = append(m.Pods, o.Pods...)
	m.Services = append(m.Services, o.Services...)
	m.ConfigMaps = append(m.ConfigMaps, o.ConfigMaps...)
	m.Secrets = append(m.Secrets, o.Secrets...)
	m.Errors = append(m.Errors, o.Errors...)
	m.Invalid = append(m.Invalid, o.Invalid...)
}

// FileError is a problem with one manifest file.
type FileError struct {
	File string // base name in the manifest directory
	Err  error
	// Pod is, for an entry of Manifests.Invalid, the pod recorded as
	// invalid; nil otherwise.
	Pod *corev1.Pod
}

func (e *FileError) Error() string { return e.File + ": " + e.Err.Error() }

func (e *FileError) Unwrap() error { return e.Err }

// IsManifest reports whether a file name is read as a manifest: *.yaml or
// *.yml, not hidden. Editor swap files and backups are ignored.
func IsManifest(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}

// Read reads every manifest file in dir. A missing directory holds no
// manifests; any other failure to list it is returned as an error.
func Read(dir, nodeName string) (Manifests, error) {
	return new(Reader).Read(dir, nodeName)
}

// Reader reads a manifest directory again and again, as Read does, but
// decodes a file only when its content or the node name changed since the
// last read: the agent re-reads its manifests every 20 s, and decoding
// YAML was the largest part of an idle agent's CPU. The zero Reader is
// ready to use; it is safe for concurrent use.
type Reader struct {
	mu    sync.Mutex
	files map[string]parsedFile
}

type parsedFile struct {
	data     []byte
	nodeName string
	m        Manifests
}

// Read reads every manifest file in dir, like the function Read. The
// objects it returns are the caller's own.
func (r *Reader) Read(dir, nodeName string) (Manifests, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]parsedFile{}
	defer func() { r.files = seen }()
	var m Manifests
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("read manifest dir: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() || !IsManifest(e.Name()) {
			continue
		}
		data, err := readFile(filepath.Join(dir, e.Name()))
		if err != nil {
			m.Errors = append(m.Errors, &FileError{File: e.Name(), Err: err})
			continue
		}
		pf, ok := r.files[e.Name()]
		if !ok || pf.nodeName != nodeName || !bytes.Equal(pf.data, data) {
			pf = parsedFile{data: data, nodeName: nodeName, m: Parse(e.Name(), data, nodeName)}
		}
		seen[e.Name()] = pf
		m.add(pf.m.deepCopy())
	}
	return m, nil
}

// deepCopy copies m's objects, so a cached parse is never shared.
func (m Manifests) deepCopy() Manifests {
	out := Manifests{Errors: slices.Clone(m.Errors)}
	for _, p := range m.Pods {
		out.Pods = append(out.Pods, p.DeepCopy())
	}
	for _, s := range m.Services {
		out.Services = append(out.Services, s.DeepCopy())
	}
	for _, c := range m.ConfigMaps {
		out.ConfigMaps = append(out.ConfigMaps, c.DeepCopy())
	}
	for _, s := range m.Secrets {
		out.Secrets = append(out.Secrets, s.DeepCopy())
	}
	for _, e := range m.Invalid {
		c := *e
		c.Pod = e.Pod.DeepCopy()
		out.Invalid = append(out.Invalid, &c)
	}
	return out
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Size() > maxFileSize {
		return nil, fmt.Errorf("file is %d bytes, more than the %d a manifest may have", st.Size(), maxFileSize)
	}
	return os.ReadFile(path)
}

// Parse decodes the documents of one manifest file. Good documents are
// returned even when others in the same file are bad. A pod whose metadata
// is good but whose spec is not is returned too, marked invalid (see
// AnnotationInvalid and Invalid); a pod whose name or namespace cannot be
// read or is bad yields only an error.
func Parse(file string, data []byte, nodeName string) Manifests {
	var m Manifests
	fail := func(err error) { m.Errors = append(m.Errors, &FileError{File: file, Err: err}) }
	docs, err := yamlcheck.Documents(data)
	if err != nil {
		fail(err)
	}
	for i, doc := range docs {
		where := fmt.Sprintf("document %d", i+1)
		var tm metav1.TypeMeta
		if err := decodeTypeMeta(doc, &tm); err != nil {
			fail(fmt.Errorf("%s: %w", where, err))
			continue
		}
		switch {
		case tm.APIVersion == "v1" && tm.Kind == "Pod":
			p, name, invalid, err := decodePod(doc)
			if err != nil {
				if name != "" {
					where += " (Pod " + name + ")"
				} else {
					where += " (Pod)"
				}
				fail(fmt.Errorf("%s: %w", where, withLine(doc, err)))
				continue
			}
			p = staticPod(p, file, data, nodeName)
			if invalid != nil {
				invalid = withLine(doc, invalid)
				p.Annotations[AnnotationInvalid] = oneLine(invalid)
				m.Invalid = append(m.Invalid, &FileError{File: file, Err: fmt.Errorf("%s (Pod %s): %w", where, name, invalid), Pod: p})
			}
			m.Pods = append(m.Pods, p)
		case tm.APIVersion == "v1" && tm.Kind == "Service":
			s := &corev1.Service{}
			if err := yamlcheck.Decode(doc, s); err != nil {
				fail(fmt.Errorf("%s (Service): %w", where, err))
				continue
			}
			if err := validateService(s); err != nil {
				fail(fmt.Errorf("%s (Service %s): %w", where, s.Name, withLine(doc, err)))
				continue
			}
			m.Services = append(m.Services, staticService(s, file))
		case tm.APIVersion == "v1" && tm.Kind == "ConfigMap":
			c := &corev1.ConfigMap{}
			if err := yamlcheck.Decode(doc, c); err != nil {
				fail(fmt.Errorf("%s (ConfigMap): %w", where, err))
				continue
			}
			if err := validateConfigMap(c); err != nil {
				fail(fmt.Errorf("%s (ConfigMap %s): %w", where, c.Name, withLine(doc, err)))
				continue
			}
			setStatic(&c.ObjectMeta, file)
			m.ConfigMaps = append(m.ConfigMaps, c)
		case tm.APIVersion == "v1" && tm.Kind == "Secret":
			sec := &corev1.Secret{}
			if err := yamlcheck.Decode(doc, sec); err != nil {
				fail(fmt.Errorf("%s (Secret): %w", where, err))
				continue
			}
			if err := validateSecret(sec); err != nil {
				fail(fmt.Errorf("%s (Secret %s): %w", where, sec.Name, withLine(doc, err)))
				continue
			}
			m.Secrets = append(m.Secrets, staticSecret(sec, file))
		case tm.Kind == "":
			fail(fmt.Errorf("%s: kind: is required (Pod, Service, ConfigMap or Secret)", where))
		default:
			fail(fmt.Errorf("%s: %s %s is not supported here; only v1 Pod, Service, ConfigMap and Secret", where, tm.APIVersion, tm.Kind))
		}
	}
	return m
}

// decodePod decodes and checks a Pod document. A document whose metadata
// cannot be read or is bad yields no pod, only err; name is the pod's name
// when it could be read. A document whose metadata is good but whose spec
// is not yields the pod and invalid, naming every bad field; a spec that
// cannot be decoded at all (a quantity that does not parse, an unknown
// field) is left empty.
func decodePod(doc *yaml.Node) (p *corev1.Pod, name string, invalid, err error) {
	p = &corev1.Pod{}
	if derr := yamlcheck.Decode(doc, p); derr != nil {
		var meta metav1.ObjectMeta
		mn := mappingValue(rootNode(doc), "metadata")
		if mn == nil || yamlcheck.Decode(mn, &meta) != nil {
			return nil, "", nil, derr
		}
		if errs := checkObjectMeta(&meta); len(errs) > 0 {
			return nil, meta.Name, nil, errors.Join(append(errs, derr)...)
		}
		return &corev1.Pod{ObjectMeta: meta}, meta.Name, derr, nil
	}
	specErrs := validatePodSpec(&p.Spec)
	if errs := checkObjectMeta(&p.ObjectMeta); len(errs) > 0 {
		return nil, p.Name, nil, errors.Join(append(errs, specErrs...)...)
	}
	return p, p.Name, errors.Join(specErrs...), nil
}

// oneLine renders an error, and each of the errors it joins, on one line,
// separated by "; ".
func oneLine(err error) string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var parts []string
		for _, e := range j.Unwrap() {
			parts = append(parts, oneLine(e))
		}
		return strings.Join(parts, "; ")
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// Invalid returns why a pod read from a manifest is invalid, and whether
// it is (see AnnotationInvalid). An invalid pod must never be run.
func Invalid(p *corev1.Pod) (msg string, invalid bool) {
	if p == nil || p.Annotations[AnnotationSource] != "file" {
		return "", false
	}
	msg, invalid = p.Annotations[AnnotationInvalid]
	return msg, invalid
}

// rootNode is the top node of a document.
func rootNode(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0]
	}
	return doc
}

func decodeTypeMeta(doc *yaml.Node, tm *metav1.TypeMeta) error {
	n := rootNode(doc)
	if n.Kind != yaml.MappingNode {
		return errors.New("is not a mapping")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch n.Content[i].Value {
		case "apiVersion":
			tm.APIVersion = n.Content[i+1].Value
		case "kind":
			tm.Kind = n.Content[i+1].Value
		}
	}
	return nil
}

// withLine adds the line of a validation error's field path.
func withLine(doc *yaml.Node, err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, withLine(doc, e))
		}
		return errors.Join(out...)
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		line := yamlcheck.Line(doc, fe.path)
		if fe.isKey {
			line = keyLine(doc, fe.path, fe.key)
		}
		if line > 0 {
			return fmt.Errorf("%w (line %d)", err, line)
		}
	}
	return err
}

// staticPod names and defaults a manifest pod the way kubelet does: the
// node name appended to its name, a UID hashed from the file and node,
// spec.nodeName set and the config annotations added.
func staticPod(p *corev1.Pod, file string, data []byte, nodeName string) *corev1.Pod {
	if p.Namespace == "" {
		p.Namespace = metav1.NamespaceDefault
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", nodeName, file, p.Namespace, p.Name)
	h.Write(data)
	uid := hex.EncodeToString(h.Sum(nil))[:32]
	p.Name = p.Name + "-" + nodeName
	p.UID = types.UID(uid)
	p.Spec.NodeName = nodeName
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	delete(p.Annotations, AnnotationInvalid)
	p.Annotations[AnnotationSource] = "file"
	p.Annotations[AnnotationHash] = uid
	p.Annotations[AnnotationFile] = file
	// kubelet lets static pods tolerate every NoExecute taint.
	p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	DefaultPod(p)
	return p
}

// keyLine returns the line of key in the mapping at path, or of the
// mapping itself when the key is not written there (a merge key, say).
func keyLine(doc *yaml.Node, path, key string) int {
	n := rootNode(doc)
	for _, name := range strings.Split(path, ".") {
		n = mappingValue(n, name)
		if n == nil {
			return yamlcheck.Line(doc, path)
		}
	}
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i].Line
		}
	}
	return yamlcheck.Line(doc, path)
}

func mappingValue(n *yaml.Node, name string) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == name {
			v := n.Content[i+1]
			if v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			return v
		}
	}
	return nil
}

// setStatic defaults the namespace and adds the annotations of an object
// from a manifest file. Only pods have their name changed.
func setStatic(m *metav1.ObjectMeta, file string) {
	if m.Namespace == "" {
		m.Namespace = metav1.NamespaceDefault
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[AnnotationSource] = "file"
	m.Annotations[AnnotationFile] = file
}

func staticService(s *corev1.Service, file string) *corev1.Service {
	setStatic(&s.ObjectMeta, file)
	if s.Spec.Type == "" {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if s.Spec.SessionAffinity == "" {
		s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Protocol == "" {
			s.Spec.Ports[i].Protocol = corev1.ProtocolTCP
		}
		if s.Spec.Ports[i].TargetPort.IntVal == 0 && s.Spec.Ports[i].TargetPort.StrVal == "" {
			s.Spec.Ports[i].TargetPort.IntVal = s.Spec.Ports[i].Port
		}
	}
	return s
}

// staticSecret merges stringData into data, as the API server does on
// write (stringData wins), and defaults the type to Opaque.
func staticSecret(s *corev1.Secret, file string) *corev1.Secret {
	setStatic(&s.ObjectMeta, file)
	if len(s.StringData) > 0 && s.Data == nil {
		s.Data = make(map[string][]byte, len(s.StringData))
	}
	for k, v := range s.StringData {
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	return s
}

// DefaultPod fills the fields the API server's defaulting would, for pods
// that never went through an API server.
func DefaultPod(p *corev1.Pod) {
	s := &p.Spec
	if s.RestartPolicy == "" {
		s.RestartPolicy = corev1.RestartPolicyAlways
	}
	if s.DNSPolicy == "" {
		s.DNSPolicy = corev1.DNSClusterFirst
	}
	if s.TerminationGracePeriodSeconds == nil {
		g := int64(corev1.DefaultTerminationGracePeriodSeconds)
		s.TerminationGracePeriodSeconds = &g
	}
	if s.SchedulerName == "" {
		s.SchedulerName = corev1.DefaultSchedulerName
	}
	if s.SecurityContext == nil {
		s.SecurityContext = &corev1.PodSecurityContext{}
	}
	if s.EnableServiceLinks == nil {
		t := true
		s.EnableServiceLinks = &t
	}
	for _, cs := range [][]corev1.Container{s.InitContainers, s.Containers} {
		for i := range cs {
			defaultContainer(&cs[i])
		}
	}
}

func defaultContainer(c *corev1.Container) {
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = DefaultPullPolicy(c.Image)
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
}

// DefaultPullPolicy is the pull policy the Kubernetes API gives a
// container that sets none: Always when the image's tag is "latest", or
// when it has neither tag nor digest; IfNotPresent otherwise
// ("x:latest@sha256:..." is Always, "x@sha256:..." IfNotPresent).
func DefaultPullPolicy(image string) corev1.PullPolicy {
	name, digested := image, false
	if i := strings.Index(image, "@"); i >= 0 {
		name, digested = image[:i], true
	}
	tag := ""
	if colon := strings.LastIndex(name, ":"); colon > strings.LastIndex(name, "/") {
		tag = name[colon+1:]
	}
	if tag == "latest" || (tag == "" && !digested) {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// Sorted returns pods sorted by namespace/name, for stable output.
func Sorted(pods []*corev1.Pod) []*corev1.Pod {
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
	return pods
}
