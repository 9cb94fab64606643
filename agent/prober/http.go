package prober

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// maxRedirects is how many same-host redirects an httpGet probe follows,
// like Go's and kubelet's default.
const maxRedirects = 10

// probeTransport is shared by all httpGet probes. Like kubelet's it skips
// certificate verification, uses no proxy, asks for no compression and
// keeps no idle connections.
var probeTransport = sync.OnceValue(func() *http.Transport {
	return &http.Transport{
		Proxy:              nil,
		DialContext:        dial,
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
})

// probeClient follows redirects only to the host of the first request, so
// a probe cannot be sent elsewhere.
var probeClient = sync.OnceValue(func() *http.Client {
	return &http.Client{
		Transport: probeTransport(),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Hostname() != via[0].URL.Hostname() {
				return http.ErrUseLastResponse
			}
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			return nil
		},
	}
})

func resolveHTTP(path string, a *corev1.HTTPGetAction, t Target) (attempt, error) {
	var scheme string
	switch a.Scheme {
	case "", corev1.URISchemeHTTP:
		scheme = "http"
	case corev1.URISchemeHTTPS:
		scheme = "https"
	default:
		return nil, bad(path+".scheme", "%q is not HTTP or HTTPS", a.Scheme)
	}
	port, err := resolvePort(path+".port", a.Port, t.Ports)
	if err != nil {
		return nil, err
	}
	addr, err := hostPort(path+".host", a.Host, t, port)
	if err != nil {
		return nil, err
	}
	// As kubelet: a path that does not parse is sent as it is.
	u, err := url.Parse(a.Path)
	if err != nil {
		u = &url.URL{Path: a.Path}
	}
	u.Scheme, u.Host = scheme, addr
	if u.Path == "" {
		u.Path = "/"
	}
	header := make(http.Header)
	for i, h := range a.HTTPHeaders {
		if h.Name == "" || strings.ContainsAny(h.Name, " \t\r\n:") {
			return nil, bad(fmt.Sprintf("%s.httpHeaders[%d].name", path, i), "%q is not a valid header name", h.Name)
		}
		header.Add(h.Name, h.Value)
	}
	if header.Get("User-Agent") == "" {
		header.Set("User-Agent", userAgent)
	}
	if header.Get("Accept") == "" {
		header.Set("Accept", "*/*")
	}
	target := u.String()
	return func(ctx context.Context) (Result, string) {
		return doHTTP(ctx, target, header)
	}, nil
}

func doHTTP(ctx context.Context, target string, header http.Header) (Result, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return Unknown, fmt.Sprintf("http probe: %v", err)
	}
	req.Header = header.Clone()
	if host := header.Get("Host"); host != "" {
		req.Host = host
	}
	res, err := probeClient().Do(req)
	if err != nil {
		return Failure, err.Error()
	}
	defer res.Body.Close()
	// Read (at most maxOutput of) the body so the server can finish its
	// reply before the connection closes; only a warning shows it.
	body, err := io.ReadAll(io.LimitReader(res.Body, maxOutput))
	if err != nil {
		return Failure, fmt.Sprintf("HTTP probe failed reading body: %v", err)
	}
	if res.StatusCode < http.StatusOK || res.StatusCode >= http.StatusBadRequest {
		return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", res.StatusCode)
	}
	if res.StatusCode >= http.StatusMultipleChoices {
		// A redirect to another host, not followed: kubelet counts it as
		// success with a warning.
		// kubelet's words, which its ProbeWarning event carries.
		return Success, fmt.Sprintf("Probe terminated redirects, Response body: %s", body)
	}
	return Success, ""
}
