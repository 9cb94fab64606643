package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// runHook runs a lifecycle hook (postStart or preStop) of a running
// container: exec in the container, an HTTP GET to the pod, or a sleep,
// as kubelet does. It returns an error naming what failed.
func (w *worker) runHook(ctx context.Context, c *corev1.Container, h *corev1.LifecycleHandler, containerID string) error {
	switch {
	case h.Exec != nil:
		code, out, err := w.m.rt.Exec(ctx, containerID, h.Exec.Command)
		if err != nil {
			return fmt.Errorf("exec %v: %w", h.Exec.Command, err)
		}
		if code != 0 {
			return fmt.Errorf("exec %v: exit code %d: %s", h.Exec.Command, code, truncate(out, 512))
		}
		return nil
	case h.HTTPGet != nil:
		return w.hookHTTP(ctx, c, h.HTTPGet)
	case h.Sleep != nil:
		t := w.m.clock.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer t.Stop()
		select {
		case <-t.C():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case h.TCPSocket != nil:
		return fmt.Errorf("tcpSocket hooks are deprecated and not supported")
	}
	return fmt.Errorf("hook has no handler")
}

func (w *worker) hookHTTP(ctx context.Context, c *corev1.Container, g *corev1.HTTPGetAction) error {
	port, err := hookPort(c, g.Port)
	if err != nil {
		return err
	}
	host := g.Host
	if host == "" {
		host = w.podIP()
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := g.Path
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	url := scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("httpGet %s: %w", url, err)
	}
	for _, hd := range g.HTTPHeaders {
		if hd.Name == "Host" {
			req.Host = hd.Value
			continue
		}
		req.Header.Add(hd.Name, hd.Value)
	}
	client := &http.Client{Transport: &http.Transport{
		// As kubelet: a hook does not verify the pod's certificate.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		Proxy:           nil,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("httpGet %s: %w", url, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("httpGet %s: status %s", url, resp.Status)
	}
	return nil
}

func hookPort(c *corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal < 1 || p.IntVal > 65535 {
			return 0, fmt.Errorf("httpGet port %d is out of range", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("httpGet port: no container port named %q", p.StrVal)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
