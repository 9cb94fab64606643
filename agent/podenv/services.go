package podenv

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// masterService is the Service whose variables every pod gets, whatever
// its enableServiceLinks: in-cluster clients find the API server by them.
const masterNamespace, masterService = "default", "kubernetes"

// serviceEnv is kubelet's service environment of pod: for each Service
// with a cluster IP in the pod's namespace (when enableServiceLinks is
// not false) and for default/kubernetes, NAME_SERVICE_HOST,
// NAME_SERVICE_PORT, NAME_SERVICE_PORT_PORTNAME and the Docker-link
// variables (NAME_PORT, NAME_PORT_80_TCP...). A Service of the pod's
// namespace wins over one of the same name in default.
func serviceEnv(pod *corev1.Pod, src Sources) (map[string]string, error) {
	if src.Services == nil {
		return nil, nil
	}
	byName := map[string]*corev1.Service{}
	svcs, err := src.Services(masterNamespace)
	if err != nil {
		return nil, fmt.Errorf("list services of namespace %s: %w", masterNamespace, err)
	}
	for _, s := range svcs {
		if s.Name == masterService || (pod.Namespace == masterNamespace && serviceLinks(pod)) {
			byName[s.Name] = s
		}
	}
	if pod.Namespace != masterNamespace && serviceLinks(pod) {
		svcs, err := src.Services(pod.Namespace)
		if err != nil {
			return nil, fmt.Errorf("list services of namespace %s: %w", pod.Namespace, err)
		}
		for _, s := range svcs {
			byName[s.Name] = s
		}
	}
	env := map[string]string{}
	for _, s := range byName {
		addServiceEnv(env, s)
	}
	return env, nil
}

// serviceLinks reports whether the pod wants its namespace's Services in
// its environment (enableServiceLinks, true when unset).
func serviceLinks(pod *corev1.Pod) bool {
	return pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
}

// addServiceEnv adds s's variables, as kubelet's envvars.FromServices.
func addServiceEnv(env map[string]string, s *corev1.Service) {
	ip := s.Spec.ClusterIP
	if ip == "" || ip == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
		return
	}
	prefix := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
	env[prefix+"_SERVICE_HOST"] = ip
	env[prefix+"_SERVICE_PORT"] = strconv.Itoa(int(s.Spec.Ports[0].Port))
	for i, p := range s.Spec.Ports {
		port := strconv.Itoa(int(p.Port))
		if p.Name != "" {
			env[prefix+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_"))] = port
		}
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		url := strings.ToLower(proto) + "://" + net.JoinHostPort(ip, port)
		if i == 0 {
			env[prefix+"_PORT"] = url // Docker's first-port special case
		}
		pp := prefix + "_PORT_" + port + "_" + strings.ToUpper(proto)
		env[pp] = url
		env[pp+"_PROTO"] = strings.ToLower(proto)
		env[pp+"_PORT"] = port
		env[pp+"_ADDR"] = ip
	}
}
