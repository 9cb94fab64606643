package staticpods

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// fieldError is a bad value at a field path, or a bad key of the map at
// that path.
type fieldError struct {
	path, msg string
	key       string
	isKey     bool
}

func (e *fieldError) Error() string {
	if e.isKey {
		return fmt.Sprintf("%s[%q]: %s", e.path, e.key, e.msg)
	}
	return e.path + ": " + e.msg
}

func bad(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

func badKey(path, key, format string, args ...any) error {
	return &fieldError{path: path, key: key, isKey: true, msg: fmt.Sprintf(format, args...)}
}

func checkName(path, name string, label bool) error {
	if name == "" {
		return bad(path, "is required")
	}
	check := validation.IsDNS1123Subdomain
	if label {
		check = validation.IsDNS1123Label
	}
	if errs := check(name); len(errs) > 0 {
		return bad(path, "%q is invalid: %s", name, errs[0])
	}
	return nil
}

// Validate checks a pod from any source (the API server, MQTT, a manifest)
// as a manifest's pod is checked: what the agent relies on to run it, and
// that this node can provide its volumes. It returns nil for a good pod,
// or an error naming every bad field, on one line separated by "; ", in
// a fixed order. A pod it rejects must never be run.
func Validate(p *corev1.Pod) error {
	errs := validatePodSpec(&p.Spec)
	if len(errs) == 0 {
		return nil
	}
	return &specError{errs: errs}
}

// specError is every bad field of a pod spec.
type specError struct{ errs []error }

func (e *specError) Error() string { return oneLine(errors.Join(e.errs...)) }

func (e *specError) Unwrap() []error { return e.errs }

// validatePodSpec checks what the agent relies on to run a pod; the API
// server's full validation is not linked into the binary. A pod whose spec
// is bad is recorded as invalid and never run (its metadata is checked by
// checkObjectMeta: a pod whose name is bad yields no object at all). The
// errors come in a fixed order (volumes, then each container in turn, its
// fields always checked in the same order), so the same spec always gives
// the same message.
func validatePodSpec(s *corev1.PodSpec) []error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch s.RestartPolicy {
	case "", corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		add(bad("spec.restartPolicy", "%q is not Always, OnFailure or Never", s.RestartPolicy))
	}
	volumes := map[string]bool{}
	for i, v := range s.Volumes {
		path := fmt.Sprintf("spec.volumes[%d].name", i)
		add(checkName(path, v.Name, true))
		if volumes[v.Name] && v.Name != "" {
			add(bad(path, "%q is used by another volume", v.Name))
		}
		volumes[v.Name] = true
		add(checkVolumeSource(fmt.Sprintf("spec.volumes[%d]", i), &v.VolumeSource))
	}
	if len(s.Containers) == 0 {
		add(bad("spec.containers", "at least one container is required"))
	}
	seen := map[string]bool{}
	for _, group := range []struct {
		field string
		cs    []corev1.Container
	}{{"spec.initContainers", s.InitContainers}, {"spec.containers", s.Containers}} {
		for i := range group.cs {
			c := &group.cs[i]
			path := fmt.Sprintf("%s[%d]", group.field, i)
			add(checkName(path+".name", c.Name, true))
			if seen[c.Name] && c.Name != "" {
				add(bad(path+".name", "%q is used by another container", c.Name))
			}
			seen[c.Name] = true
			errs = append(errs, validateContainer(path, c, volumes)...)
		}
	}
	return errs
}

// checkVolumeSource checks that this node can provide a volume: the
// kinds agent/volume sets up are hostPath, emptyDir (on disk or in
// memory), configMap, secret, downwardAPI and projected (of config maps,
// secrets and the downward API). A volume with no source, and a projected
// serviceAccountToken, are left to agent/volume, which reports them when
// the container is created: every pod of a real cluster has such a token
// unless automountServiceAccountToken is false.
func checkVolumeSource(path string, v *corev1.VolumeSource) error {
	switch {
	case v.HostPath != nil, v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil:
		return nil
	case v.EmptyDir != nil:
		switch v.EmptyDir.Medium {
		case corev1.StorageMediumDefault, corev1.StorageMediumMemory:
			return nil
		}
		return bad(path+".emptyDir.medium", "%q is not supported on this node (only \"\" or Memory)", v.EmptyDir.Medium)
	case v.Projected != nil:
		for i, src := range v.Projected.Sources {
			sp := fmt.Sprintf("%s.projected.sources[%d]", path, i)
			switch {
			case src.ConfigMap != nil, src.Secret != nil, src.DownwardAPI != nil, src.ServiceAccountToken != nil:
			default:
				name := setField(reflect.ValueOf(src))
				if name == "" {
					return bad(sp, "no projection is set")
				}
				return bad(sp+"."+name, "this projection is not supported on this node")
			}
		}
		return nil
	}
	if name := setField(reflect.ValueOf(*v)); name != "" {
		return bad(path+"."+name, "%s volumes are not supported on this node", name)
	}
	return nil
}

// setField returns the JSON name of the first pointer field of struct v
// that is set, "" for none.
func setField(v reflect.Value) string {
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return ""
}

// validateContainer checks one container of a pod with the given volumes.
func validateContainer(path string, c *corev1.Container, volumes map[string]bool) []error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if strings.TrimSpace(c.Image) == "" {
		add(bad(path+".image", "is required"))
	}
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		add(bad(path+".imagePullPolicy", "%q is not Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	portNames := map[string]bool{}
	for j, port := range c.Ports {
		pp := fmt.Sprintf("%s.ports[%d]", path, j)
		if port.Name != "" {
			if msgs := validation.IsValidPortName(port.Name); len(msgs) > 0 {
				add(bad(pp+".name", "%q is not a valid port name: %s", port.Name, msgs[0]))
			} else if portNames[port.Name] {
				add(bad(pp+".name", "%q is used by another port of this container", port.Name))
			}
			portNames[port.Name] = true
		}
		if port.ContainerPort < 1 || port.ContainerPort > 65535 {
			add(bad(pp+".containerPort", "%d is not from 1 to 65535", port.ContainerPort))
		}
		if port.HostPort < 0 || port.HostPort > 65535 {
			add(bad(pp+".hostPort", "%d is not from 0 to 65535", port.HostPort))
		}
		add(checkProtocol(pp+".protocol", port.Protocol))
	}
	errs = append(errs, checkResources(path+".resources", c.Resources)...)
	for j, vm := range c.VolumeMounts {
		vp := fmt.Sprintf("%s.volumeMounts[%d]", path, j)
		switch {
		case vm.Name == "":
			add(bad(vp+".name", "is required"))
		case !volumes[vm.Name]:
			add(bad(vp+".name", "%q is not a volume of the pod (spec.volumes)", vm.Name))
		}
		if vm.MountPath == "" {
			add(bad(vp+".mountPath", "is required"))
		}
	}
	for _, pr := range []struct {
		field string
		p     *corev1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
		if pr.p != nil {
			errs = append(errs, checkProbe(path+"."+pr.field, pr.p, c.Ports)...)
		}
	}
	if c.Lifecycle != nil {
		for _, h := range []struct {
			field string
			h     *corev1.LifecycleHandler
		}{{"postStart", c.Lifecycle.PostStart}, {"preStop", c.Lifecycle.PreStop}} {
			if h.h != nil {
				errs = append(errs, checkHook(path+".lifecycle."+h.field, h.h, c.Ports)...)
			}
		}
	}
	return errs
}

// checkResources checks that no quantity is negative and no request is
// above its limit. Resource names are taken in sorted order.
func checkResources(path string, r corev1.ResourceRequirements) []error {
	var errs []error
	for _, list := range []struct {
		field string
		rl    corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range slices.Sorted(maps.Keys(list.rl)) {
			q := list.rl[name]
			if q.Sign() < 0 {
				errs = append(errs, bad(path+"."+list.field+"."+string(name), "%s must not be negative", q.String()))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.Requests)) {
		req, lim := r.Requests[name], r.Limits[name]
		if _, ok := r.Limits[name]; ok && req.Sign() >= 0 && lim.Sign() >= 0 && req.Cmp(lim) > 0 {
			errs = append(errs, bad(path+".requests."+string(name), "%s is more than the limit %s", req.String(), lim.String()))
		}
	}
	return errs
}

// checkProbe checks that a probe has one handler, with a port the
// container has. The numbers (periods, thresholds) are the prober's to
// check.
func checkProbe(path string, p *corev1.Probe, ports []corev1.ContainerPort) []error {
	h := p.ProbeHandler
	var errs []error
	if err := checkOneHandler(path, "exec, httpGet, tcpSocket or grpc", h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkHandlerPorts(path, h.HTTPGet, h.TCPSocket, ports)...)
	if h.GRPC != nil && (h.GRPC.Port < 1 || h.GRPC.Port > 65535) {
		errs = append(errs, bad(path+".grpc.port", "%d is not from 1 to 65535", h.GRPC.Port))
	}
	return errs
}

// checkHook checks that a lifecycle hook has one handler, with a port the
// container has.
func checkHook(path string, h *corev1.LifecycleHandler, ports []corev1.ContainerPort) []error {
	var errs []error
	if err := checkOneHandler(path, "exec, httpGet, tcpSocket or sleep", h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.Sleep != nil); err != nil {
		errs = append(errs, err)
	}
	return append(errs, checkHandlerPorts(path, h.HTTPGet, h.TCPSocket, ports)...)
}

// checkHandlerPorts checks the port of a probe's or hook's httpGet and
// tcpSocket handler, whichever is set, against the container's ports.
func checkHandlerPorts(path string, http *corev1.HTTPGetAction, tcp *corev1.TCPSocketAction, ports []corev1.ContainerPort) []error {
	var errs []error
	if http != nil {
		if err := checkHandlerPort(path+".httpGet.port", http.Port, ports); err != nil {
			errs = append(errs, err)
		}
	}
	if tcp != nil {
		if err := checkHandlerPort(path+".tcpSocket.port", tcp.Port, ports); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func checkOneHandler(path, kinds string, set ...bool) error {
	n := 0
	for _, s := range set {
		if s {
			n++
		}
	}
	switch {
	case n == 0:
		return bad(path, "must specify a handler (%s)", kinds)
	case n > 1:
		return bad(path, "may not specify more than one handler")
	}
	return nil
}

// checkHandlerPort checks the port of a probe or hook: a number from 1 to
// 65535, or the name of one of the container's ports. As in kubelet's
// prober, a name no port has that parses as a number is that number.
func checkHandlerPort(path string, port intstr.IntOrString, ports []corev1.ContainerPort) error {
	n := int(port.IntVal)
	if port.Type == intstr.String {
		for _, p := range ports {
			if p.Name != "" && p.Name == port.StrVal {
				return nil
			}
		}
		v, err := strconv.Atoi(port.StrVal)
		if err != nil {
			if msgs := validation.IsValidPortName(port.StrVal); len(msgs) > 0 {
				return bad(path, "%q is not a valid port name: %s", port.StrVal, msgs[0])
			}
			return bad(path, "%q is not the name of a port of this container", port.StrVal)
		}
		n = v
	}
	if n < 1 || n > 65535 {
		return bad(path, "%d is not from 1 to 65535", n)
	}
	return nil
}

func checkProtocol(path string, p corev1.Protocol) error {
	switch p {
	case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return bad(path, "%q is not TCP, UDP or SCTP", p)
}

// validateService checks a Service manifest. With no API server to
// allocate them, its cluster IP (unless headless) and, for type NodePort
// or LoadBalancer, each port's node port must be written in it.
func validateService(s *corev1.Service) error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(checkName("metadata.name", s.Name, true))
	if s.Namespace != "" {
		add(checkName("metadata.namespace", s.Namespace, true))
	}
	external := false
	switch s.Spec.Type {
	case "", corev1.ServiceTypeClusterIP:
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		external = true
	default:
		add(bad("spec.type", "%q is not ClusterIP, NodePort or LoadBalancer", s.Spec.Type))
	}
	headless := s.Spec.ClusterIP == corev1.ClusterIPNone || (len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIPs[0] == corev1.ClusterIPNone)
	errs = append(errs, checkClusterIPs(&s.Spec, headless, external)...)
	for i, ip := range s.Spec.ExternalIPs {
		add(checkIP(fmt.Sprintf("spec.externalIPs[%d]", i), ip))
	}
	if len(s.Spec.Ports) == 0 && !headless {
		add(bad("spec.ports", "at least one port is required"))
	}
	names := map[string]bool{}
	for i, p := range s.Spec.Ports {
		pp := fmt.Sprintf("spec.ports[%d]", i)
		if p.Port < 1 || p.Port > 65535 {
			add(bad(pp+".port", "%d is not from 1 to 65535", p.Port))
		}
		switch {
		case p.NodePort < 0 || p.NodePort > 65535:
			add(bad(pp+".nodePort", "%d is not from 0 to 65535", p.NodePort))
		case p.NodePort == 0 && external:
			add(bad(pp+".nodePort", "is required when spec.type is %s (no API server allocates one; 30000-32767 is the usual range)", s.Spec.Type))
		case p.NodePort != 0 && !external:
			add(bad(pp+".nodePort", "may not be set when spec.type is ClusterIP"))
		}
		add(checkProtocol(pp+".protocol", p.Protocol))
		switch {
		case len(s.Spec.Ports) > 1 && p.Name == "":
			add(bad(pp+".name", "is required when a Service has more than one port"))
		case p.Name != "" && names[p.Name]:
			add(bad(pp+".name", "%q is used by another port", p.Name))
		}
		names[p.Name] = true
	}
	return errors.Join(errs...)
}

// checkClusterIPs checks that a Service that is not headless states its
// cluster IP (in clusterIP, clusterIPs or both, agreeing), at most one
// address of each family, and that a headless one is of type ClusterIP.
func checkClusterIPs(spec *corev1.ServiceSpec, headless, external bool) []error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if headless {
		if external {
			add(bad("spec.clusterIP", "%q may not be used when spec.type is %s", corev1.ClusterIPNone, spec.Type))
		}
		if len(spec.ClusterIPs) > 1 {
			add(bad("spec.clusterIPs", "must hold only %q for a headless service", corev1.ClusterIPNone))
		}
	} else if spec.ClusterIP == "" && len(spec.ClusterIPs) == 0 {
		add(bad("spec.clusterIP", "is required (or %q for a headless service): no API server allocates one", corev1.ClusterIPNone))
	}
	if spec.ClusterIP != "" && spec.ClusterIP != corev1.ClusterIPNone {
		add(checkIP("spec.clusterIP", spec.ClusterIP))
	}
	if len(spec.ClusterIPs) > 2 {
		add(bad("spec.clusterIPs", "has %d addresses; at most 2, one of each family", len(spec.ClusterIPs)))
	}
	var first netip.Addr
	for i, ip := range spec.ClusterIPs {
		path := fmt.Sprintf("spec.clusterIPs[%d]", i)
		switch {
		case i == 0 && spec.ClusterIP != "" && ip != spec.ClusterIP:
			add(bad(path, "%q is not spec.clusterIP %q", ip, spec.ClusterIP))
		case headless:
		case ip == corev1.ClusterIPNone:
			add(bad(path, "%q may only be the first and only address", ip))
		default:
			a, err := parseIP(path, ip)
			if err != nil {
				add(err)
				continue
			}
			if i == 0 {
				first = a
			} else if i == 1 && first.IsValid() && first.Is4() == a.Is4() {
				add(bad(path, "%q is of the same family as spec.clusterIPs[0]", ip))
			}
		}
	}
	return errs
}

// checkIP checks that s is an IP address, without a zone.
func checkIP(path, s string) error {
	_, err := parseIP(path, s)
	return err
}

// parseIP parses the IP address s at path; one with a zone is refused.
func parseIP(path, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, bad(path, "%q is not an IP address", s)
	}
	return a, nil
}

// validateConfigMap checks the name and the keys: each a valid file name
// for a configMap volume, and in data or binaryData, not both.
func validateConfigMap(c *corev1.ConfigMap) error {
	errs := checkObjectMeta(&c.ObjectMeta)
	errs = append(errs, checkKeys("data", slices.Sorted(maps.Keys(c.Data)))...)
	errs = append(errs, checkKeys("binaryData", slices.Sorted(maps.Keys(c.BinaryData)))...)
	for _, k := range slices.Sorted(maps.Keys(c.BinaryData)) {
		if _, ok := c.Data[k]; ok {
			errs = append(errs, badKey("binaryData", k, "is also in data"))
		}
	}
	return errors.Join(errs...)
}

// validateSecret checks the name and the keys of data and stringData. A
// key may be in both; stringData's value wins.
func validateSecret(s *corev1.Secret) error {
	errs := checkObjectMeta(&s.ObjectMeta)
	errs = append(errs, checkKeys("data", slices.Sorted(maps.Keys(s.Data)))...)
	errs = append(errs, checkKeys("stringData", slices.Sorted(maps.Keys(s.StringData)))...)
	return errors.Join(errs...)
}

// checkObjectMeta checks the name (a DNS-1123 subdomain) and namespace of
// an object from a manifest.
func checkObjectMeta(m *metav1.ObjectMeta) []error {
	var errs []error
	if err := checkName("metadata.name", m.Name, false); err != nil {
		errs = append(errs, err)
	}
	if m.Namespace != "" {
		if err := checkName("metadata.namespace", m.Namespace, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// checkKeys checks that keys of the map at path are config keys.
func checkKeys(path string, keys []string) []error {
	var errs []error
	for _, k := range keys {
		if msgs := validation.IsConfigMapKey(k); len(msgs) > 0 {
			errs = append(errs, badKey(path, k, "is invalid: %s", msgs[0]))
		}
	}
	return errs
}
