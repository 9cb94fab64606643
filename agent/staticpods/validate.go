package staticpods

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// validatePod checks what the agent relies on; the API server's full
// validation is not linked into the binary.
func validatePod(p *corev1.Pod) error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(checkName("metadata.name", p.Name, false))
	if p.Namespace != "" {
		add(checkName("metadata.namespace", p.Namespace, true))
	}
	switch p.Spec.RestartPolicy {
	case "", corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		add(bad("spec.restartPolicy", "%q is not Always, OnFailure or Never", p.Spec.RestartPolicy))
	}
	if len(p.Spec.Containers) == 0 {
		add(bad("spec.containers", "at least one container is required"))
	}
	seen := map[string]bool{}
	for _, group := range []struct {
		field string
		cs    []corev1.Container
	}{{"spec.initContainers", p.Spec.InitContainers}, {"spec.containers", p.Spec.Containers}} {
		for i, c := range group.cs {
			path := fmt.Sprintf("%s[%d]", group.field, i)
			add(checkName(path+".name", c.Name, true))
			if seen[c.Name] && c.Name != "" {
				add(bad(path+".name", "%q is used by another container", c.Name))
			}
			seen[c.Name] = true
			if strings.TrimSpace(c.Image) == "" {
				add(bad(path+".image", "is required"))
			}
			switch c.ImagePullPolicy {
			case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
			default:
				add(bad(path+".imagePullPolicy", "%q is not Always, IfNotPresent or Never", c.ImagePullPolicy))
			}
			for j, port := range c.Ports {
				pp := fmt.Sprintf("%s.ports[%d]", path, j)
				if port.ContainerPort < 1 || port.ContainerPort > 65535 {
					add(bad(pp+".containerPort", "%d is not from 1 to 65535", port.ContainerPort))
				}
				if port.HostPort < 0 || port.HostPort > 65535 {
					add(bad(pp+".hostPort", "%d is not from 0 to 65535", port.HostPort))
				}
				add(checkProtocol(pp+".protocol", port.Protocol))
			}
		}
	}
	return errors.Join(errs...)
}

func checkProtocol(path string, p corev1.Protocol) error {
	switch p {
	case "", corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	}
	return bad(path, "%q is not TCP, UDP or SCTP", p)
}

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
	switch s.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		add(bad("spec.type", "%q is not ClusterIP, NodePort or LoadBalancer", s.Spec.Type))
	}
	if len(s.Spec.Ports) == 0 && s.Spec.ClusterIP != corev1.ClusterIPNone {
		add(bad("spec.ports", "at least one port is required"))
	}
	for i, p := range s.Spec.Ports {
		pp := fmt.Sprintf("spec.ports[%d]", i)
		if p.Port < 1 || p.Port > 65535 {
			add(bad(pp+".port", "%d is not from 1 to 65535", p.Port))
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			add(bad(pp+".nodePort", "%d is not from 0 to 65535", p.NodePort))
		}
		add(checkProtocol(pp+".protocol", p.Protocol))
		if len(s.Spec.Ports) > 1 && p.Name == "" {
			add(bad(pp+".name", "is required when a Service has more than one port"))
		}
	}
	return errors.Join(errs...)
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
// an object that keeps the name its manifest gives it.
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
